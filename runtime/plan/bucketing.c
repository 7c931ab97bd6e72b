/* Bucketing: padding a step to one of a fixed set of shapes, the seed's way (docs/design.md, Bucketing).
 *
 * Engines that replay static-shape graphs (as the Gaudi plugin does) need every step padded to a shape
 * from a fixed list. The list is the product of three exponential ranges filtered by the seed's rules;
 * a step takes the first listed bucket that covers it, or its exact shape when none does (counted).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan/planner.h"

/* Points of a range, at most: 0 and ten exponential points. */
#define UATTN_RANGE_MAX 11

static int compare_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* The range without argument checks; out holds UATTN_RANGE_MAX. */
static int32_t bucket_range(int32_t min, int32_t max, int32_t round_up, int32_t *out) {
  int32_t n = 0;
  if (min == 0) {
    out[n++] = 0;
    min = 1;
  }
  const double ratio = (double)max / (double)min;
  for (int i = 0; i < 10; i++) {
    int32_t v = max;
    if (i < 9) {
      /* the seed: ceil(min * (max/min)^((1/9) * i) / round_up) * round_up, in double precision, with its
       * exponent written as (1./9.) * i: i / 9. can differ in the last bit */
      double x = (double)min * pow(ratio, (1.0 / 9.0) * i);
      double r = ceil(x / round_up) * round_up;
      v = r > INT32_MAX ? INT32_MAX : (int32_t)r;
    }
    out[n++] = v;
  }
  qsort(out, (size_t)n, sizeof *out, compare_i32);
  int32_t m = 0;
  for (int32_t i = 0; i < n; i++)
    if (m == 0 || out[m - 1] != out[i]) out[m++] = out[i];
  return m;
}

uattn_status uattn_bucket_range(int32_t min, int32_t max, int32_t round_up, int32_t *out, int32_t cap, int32_t *count) {
  uattn_clear_error();
  UATTN_CHECK_PTR(count, "count");
  if (min < 0 || max < min || round_up < 1)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT,
                      "bucket range needs 0 <= min <= max and round_up >= 1 (got %d, %d, %d)", min, max, round_up);
  if (cap > 0) UATTN_CHECK_PTR(out, "out");
  int32_t tmp[UATTN_RANGE_MAX];
  int32_t n = bucket_range(min, max, round_up, tmp);
  if (n > cap)
    return uattn_fail(UATTN_ERR_CAPACITY, "bucket range has %d points; out holds %d (pass cap >= %d)", n, cap,
                      UATTN_RANGE_MAX);
  memcpy(out, tmp, (size_t)n * sizeof *tmp);
  *count = n;
  return UATTN_OK;
}

/* The seed's filters. Integer division as in the seed; where its divisor would be 0 (a one-token query with
 * shared blocks, which no batch can have: a shared block has two readers) the bucket is dropped. */
static bool keep_bucket(const uattn_plan_config *c, int32_t q, int32_t s, int32_t u, bool causal) {
  const int64_t S = c->max_num_seqs, bs = c->block_size, len = c->max_model_len;
  if (causal) return (int64_t)s * bs / (q < S ? q : S) <= len;
  if (q > S) return false;
  if (s == 0 && u == 0) return false;
  if (s > 0) {
    int64_t half = q / 2;
    if (half == 0 || (int64_t)s * bs / half > len) return false;
  }
  return s > 0 || q <= u;
}

uattn_status uattn_batch_buckets_build(uattn_plan *p) {
  const uattn_plan_config *c = &p->config;
  int32_t qr[UATTN_RANGE_MAX], sr[UATTN_RANGE_MAX], ur[UATTN_RANGE_MAX];
  int32_t nq = bucket_range(1, c->max_num_batched_tokens, c->max_num_seqs, qr);
  int32_t shared_max = uattn_min_i32(c->max_model_len / c->block_size, c->num_blocks);
  int32_t ns = bucket_range(0, shared_max, c->max_num_seqs, sr);
  int32_t nu = bucket_range(0, c->num_blocks, c->max_num_seqs, ur);
  if (c->chunk_size > 0) {
    /* chunked shared attention runs whole chunks: shared sizes are multiples of the chunk */
    for (int32_t i = 0; i < ns; i++) sr[i] = uattn_ceil_div_i32(sr[i], c->chunk_size) * c->chunk_size;
    int32_t m = 0;
    for (int32_t i = 0; i < ns; i++)
      if (m == 0 || sr[m - 1] != sr[i]) sr[m++] = sr[i];
    ns = m;
  }
  size_t cap = (size_t)nq * ns * nu * 2;
  p->batch_buckets.capacity = cap;
  p->batch_buckets.shapes = uattn_alloc_bytes(&p->alloc, cap * sizeof *p->batch_buckets.shapes);
  p->batch_buckets.causal = uattn_alloc_bytes(&p->alloc, cap * sizeof *p->batch_buckets.causal);
  if (!p->batch_buckets.shapes || !p->batch_buckets.causal)
    return uattn_fail(UATTN_ERR_NO_MEMORY, "out of memory building the bucket list");
  /* loops in sorted order (query, shared, unique, causal): the list comes out sorted */
  int32_t n = 0;
  for (int32_t i = 0; i < nq; i++)
    for (int32_t j = 0; j < ns; j++)
      for (int32_t k = 0; k < nu; k++)
        for (int causal = 0; causal < 2; causal++)
          if (keep_bucket(c, qr[i], sr[j], ur[k], causal)) {
            p->batch_buckets.shapes[n] = (uattn_bucket){qr[i], sr[j], ur[k], 0};
            p->batch_buckets.causal[n] = causal;
            n++;
          }
  p->batch_buckets.count = n;
  return UATTN_OK;
}

void uattn_batch_buckets_release(uattn_plan *p) {
  uattn_alloc_release(&p->alloc, p->batch_buckets.shapes, p->batch_buckets.capacity * sizeof *p->batch_buckets.shapes);
  uattn_alloc_release(&p->alloc, p->batch_buckets.causal, p->batch_buckets.capacity * sizeof *p->batch_buckets.causal);
}

/* The seed's padding of the logits dimension: to max_num_seqs when it fits, else exact. */
static int32_t pad_logits(const uattn_plan_config *c, int32_t logits) {
  return logits <= c->max_num_seqs ? c->max_num_seqs : logits;
}

static bool covers(const uattn_bucket *b, const uattn_bucket *x) {
  return b->query_len >= x->query_len && b->shared_blocks >= x->shared_blocks && b->unique_blocks >= x->unique_blocks &&
         b->logits >= x->logits;
}

static uattn_status dp_pad(const uattn_plan_config *c, int32_t *v, const char *what) {
  int32_t extra = c->bucketing.dp_padding(c->bucketing.dp_padding_user, *v);
  if (extra < 0)
    return uattn_fail(UATTN_ERR_INCONSISTENT, "bucketing.dp_padding returned %d for %s: padding is >= 0", extra, what);
  if ((int64_t)*v + extra > INT32_MAX)
    return uattn_fail(UATTN_ERR_OVERFLOW, "bucketing.dp_padding: %s %d + %d overflows int32", what, *v, extra);
  *v += extra;
  return UATTN_OK;
}

uattn_status uattn_batch_bucket_select(const uattn_plan *p, bool contains_prompts, const uattn_bucket *exact,
                                       uattn_bucket *padded, bool *fallback) {
  const uattn_plan_config *c = &p->config;
  uattn_bucket out = *exact;
  *fallback = false;
  switch (c->bucketing.mode) {
  case UATTN_BUCKETING_NONE: break;
  case UATTN_BUCKETING_EXPONENTIAL: {
    int32_t i = 0;
    for (; i < p->batch_buckets.count; i++)
      if (p->batch_buckets.causal[i] == contains_prompts && p->batch_buckets.shapes[i].query_len >= exact->query_len &&
          p->batch_buckets.shapes[i].shared_blocks >= exact->shared_blocks &&
          p->batch_buckets.shapes[i].unique_blocks >= exact->unique_blocks)
        break;
    if (i < p->batch_buckets.count) {
      out = p->batch_buckets.shapes[i];
    } else {
      *fallback = true; /* the seed warns and runs the exact shape; the plan counts it */
    }
    out.logits = pad_logits(c, exact->logits);
    break;
  }
  case UATTN_BUCKETING_CUSTOM: {
    uattn_status st = c->bucketing.fn(c->bucketing.fn_user, contains_prompts, exact, &out);
    if (st != UATTN_OK)
      return uattn_fail(st, "bucketing.fn failed with %s for shape (%d, %d, %d, %d)", uattn_status_name(st),
                        exact->query_len, exact->shared_blocks, exact->unique_blocks, exact->logits);
    if (!covers(&out, exact))
      return uattn_fail(UATTN_ERR_INCONSISTENT,
                        "bucketing.fn returned (%d, %d, %d, %d), smaller than the batch (%d, %d, %d, %d)",
                        out.query_len, out.shared_blocks, out.unique_blocks, out.logits, exact->query_len,
                        exact->shared_blocks, exact->unique_blocks, exact->logits);
    break;
  }
  }
  if (c->bucketing.dp_padding) {
    uattn_status st;
    if ((st = dp_pad(c, &out.query_len, "query_len")) || (st = dp_pad(c, &out.shared_blocks, "shared_blocks")) ||
        (st = dp_pad(c, &out.unique_blocks, "unique_blocks")) || (st = dp_pad(c, &out.logits, "logits")))
      return st;
  }
  *padded = out;
  return UATTN_OK;
}

uattn_status uattn_plan_buckets(const uattn_plan *plan, uattn_bucket *buckets, bool *causal, int32_t cap,
                                int32_t *count) {
  uattn_clear_error();
  UATTN_CHECK_PTR(plan, "plan");
  UATTN_CHECK_PTR(count, "count");
  if (plan->config.bucketing.mode != UATTN_BUCKETING_EXPONENTIAL)
    return uattn_fail(UATTN_ERR_UNSUPPORTED,
                      "the plan was not created with UATTN_BUCKETING_EXPONENTIAL: it has no list");
  const int32_t n = plan->batch_buckets.count;
  if (!buckets && cap == 0) { /* a size query */
    *count = n;
    return UATTN_OK;
  }
  if (cap < n) return uattn_fail(UATTN_ERR_CAPACITY, "the plan has %d buckets; the output holds %d", n, cap);
  UATTN_CHECK_PTR(buckets, "buckets");
  for (int32_t i = 0; i < n; i++) {
    buckets[i] = plan->batch_buckets.shapes[i];
    buckets[i].logits = plan->config.max_num_seqs;
    if (causal) causal[i] = plan->batch_buckets.causal[i];
  }
  *count = n;
  return UATTN_OK;
}
