/* The unified-batch planner: one step's scheduler state in, everything attention needs out.
 *
 * Re-creates the seed's create_unified_batch (unified_batch.py) with uattn's semantics (docs/design.md):
 *  - a prompt request reads its num_computed cached keys from the cache and this step's keys through the
 *    causal part; any other request (decode, spec-decode verification) reads all its keys from the cache,
 *    where this step's K/V has been written first, and gets nothing from the causal part. The seed lets
 *    decode rows into the causal part too, so a decode in a batch with a prompt saw its own key twice.
 *  - a context block's usage is per query token, clamp(context_len[t] - block_start, 0, bs), so the tokens
 *    of a multi-token decode stay causal. The seed gave every token of a request the same usage.
 *  - a block is shared when more than one query token reads it, unique when exactly one does.
 *
 * A step runs in three phases so that a bad input changes nothing: validate (scratch only), size and
 * bucket (may grow buffers, writes no result), then write every result. A plan's creation and destruction
 * are in plan_create.c.
 */
#include <stdlib.h>
#include <string.h>

#include "plan/planner.h"

/* ---- phase 1: validation ------------------------------------------------------------------------- */

/* The step's num_scheduled for request r after the spec-decode rule. */
static uattn_status scheduled_tokens(const uattn_step *s, int32_t r, int32_t *out) {
  int32_t ns = s->num_scheduled[r];
  if (s->draft_offsets) {
    /* validate_draft_offsets has checked the offsets: 0 <= b <= e */
    int32_t b = s->draft_offsets[r], e = s->draft_offsets[r + 1];
    if (e > b) {
      int32_t drafts = 0;
      for (int32_t i = b; i < e; i++) {
        if (s->draft_tokens[i] < -1)
          return uattn_fail(UATTN_ERR_INVALID_ARGUMENT,
                            "step.draft_tokens[%d] = %d: a draft is a token id >= 0 or the placeholder -1", i,
                            s->draft_tokens[i]);
        drafts += s->draft_tokens[i] != -1;
      }
      ns = drafts + 1;
    }
  }
  if (ns <= 0)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "step.num_scheduled[%d] = %d: a request schedules >= 1 token", r, ns);
  *out = ns;
  return UATTN_OK;
}

/* Checks the counts of every request and stores the per-request values into the caller's scratch (the
 * plan's arrays are not touched: an error must leave the previous step intact). */
typedef struct step_shape {
  int32_t num_tokens;
  bool contains_prompts;
} step_shape;

static uattn_status validate_requests(const uattn_plan *p, const uattn_step *s, int32_t *ns_out, step_shape *shape) {
  const uattn_plan_config *c = &p->config;
  int64_t total_tokens = 0;
  shape->contains_prompts = false;
  for (int32_t r = 0; r < s->num_reqs; r++) {
    int32_t nc = s->num_computed[r], np = s->num_prompt[r], ns = 0;
    if (nc < 0) return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "step.num_computed[%d] = %d must be >= 0", r, nc);
    if (np <= 0) return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "step.num_prompt[%d] = %d must be >= 1", r, np);
    uattn_status st = scheduled_tokens(s, r, &ns);
    if (st) return st;
    int64_t seq_len = (int64_t)nc + ns;
    if (seq_len > INT32_MAX)
      return uattn_fail(UATTN_ERR_OVERFLOW, "request %d: num_computed + num_scheduled (%d + %d) overflows int32", r, nc,
                        ns);
    if (seq_len > c->max_model_len)
      return uattn_fail(UATTN_ERR_CAPACITY, "request %d: sequence length %lld exceeds the plan's max_model_len %d", r,
                        (long long)seq_len, c->max_model_len);
    /* the block table holds the rank's local positions (all of them without context parallelism) */
    const int32_t local_len = uattn_cp_local_len(c, (int32_t)seq_len);
    if (uattn_ceil_div_i32(local_len, c->block_size) > s->block_table_stride)
      return uattn_fail(UATTN_ERR_OUT_OF_RANGE,
                        "request %d: local position %d is past its block-table row (stride %d holds %lld positions)", r,
                        local_len - 1, s->block_table_stride, (long long)s->block_table_stride * c->block_size);
    if (s->token_ids && seq_len > s->token_ids_stride)
      return uattn_fail(UATTN_ERR_OUT_OF_RANGE,
                        "request %d: position %lld is past its token-id row (token_ids_stride %d)", r,
                        (long long)seq_len - 1, s->token_ids_stride);
    total_tokens += ns;
    if (total_tokens > c->max_num_batched_tokens)
      return uattn_fail(UATTN_ERR_CAPACITY,
                        "the step schedules more than the plan's max_num_batched_tokens (%d) tokens",
                        c->max_num_batched_tokens);
    shape->contains_prompts |= seq_len <= np;
    ns_out[r] = ns;
  }
  shape->num_tokens = (int32_t)total_tokens;
  return UATTN_OK;
}

/* A request of the step as the block walks see it: its new and cached tokens and its block table row. A
 * prompt (its sequence not past the prompt) reads its new tokens' keys from this step's k/v, so only the
 * tokens before them count as cached; any other request reads all of them from the cache. The block table
 * and so the walks are over the rank's local positions (schedule.h: context parallelism), the rows over
 * global ones. */
typedef struct request_view {
  int32_t nc, ns, seq_len, cached;                 /* global positions */
  int32_t local_computed, local_len, local_cached; /* the rank's share of nc, seq_len and cached */
  bool prompt;
  const int32_t *blocks;
} request_view;

static request_view request_at(const uattn_plan *p, const uattn_step *s, const int32_t *ns_of, int32_t r) {
  request_view v = {.nc = s->num_computed[r], .ns = ns_of[r]};
  v.seq_len = v.nc + v.ns;
  v.prompt = v.seq_len <= s->num_prompt[r];
  v.cached = v.prompt ? v.nc : v.seq_len;
  v.local_computed = uattn_cp_local_len(&p->config, v.nc);
  v.local_len = uattn_cp_local_len(&p->config, v.seq_len);
  v.local_cached = uattn_cp_local_len(&p->config, v.cached);
  v.blocks = s->block_table + (int64_t)r * s->block_table_stride;
  return v;
}

/* The first query row (from the request's first) that reads the context block starting at local position
 * `start`. A row's context, min(position + 1, cached), is non-decreasing in the row, so the readers are the
 * request's last rows: every row of a prompt (its context is all cached keys), else the rows from the one
 * whose position reaches the block's first key. */
static int32_t first_reader(const uattn_plan_config *c, bool prompt, int32_t nc, int32_t start) {
  return prompt ? 0 : uattn_max_i32(0, uattn_cp_global_pos(c, start) - nc);
}

/* Query tokens of a request that read the context block starting at local position `start`. */
static int32_t block_readers(const uattn_plan_config *c, const request_view *q, int32_t start) {
  return start >= q->local_cached ? 0 : q->ns - first_reader(c, q->prompt, q->nc, start);
}

static void next_stamp(uattn_plan *p) {
  if (++p->stamp == 0) { /* wrapped: old stamps could collide, so forget them */
    memset(p->blocks.stamp, 0, (size_t)p->config.num_blocks * sizeof *p->blocks.stamp);
    p->stamp = 1;
  }
}

/* Validates every block id a request touches and that the table is consistent across requests, counting
 * each block's readers on the way. */
static uattn_status validate_blocks(uattn_plan *p, const uattn_step *s, const int32_t *ns_of) {
  const int32_t bs = p->config.block_size, nblocks = p->config.num_blocks;
  uattn_block_scratch *b = &p->blocks;
  next_stamp(p);
  const uint32_t stamp = p->stamp;
  for (int32_t r = 0; r < s->num_reqs; r++) {
    const request_view q = request_at(p, s, ns_of, r);
    const int32_t *row = q.blocks;
    const int32_t nrow = uattn_ceil_div_i32(q.local_len, bs);
    for (int32_t o = 0; o < nrow; o++) {
      const int32_t id = row[o], start = o * bs;
      if (id < 0 || id >= nblocks)
        return uattn_fail(UATTN_ERR_OUT_OF_RANGE,
                          "block_table[%d][%d] = %d is not a block id (the cache has %d blocks)", r, o, id, nblocks);
      /* this step's K/V lands in it (a rank may hold none of the step's tokens) */
      const uint8_t writes = start + bs > q.local_computed && q.local_len > q.local_computed;
      const int32_t readers = block_readers(&p->config, &q, start);
      if (b->stamp[id] != stamp) {
        b->stamp[id] = stamp;
        b->start[id] = start;
        b->owner[id] = r;
        b->readers[id] = readers;
        b->written[id] = writes;
        b->index[id] = -1;
        continue;
      }
      if (b->start[id] != start)
        return uattn_fail(UATTN_ERR_INCONSISTENT,
                          "broken block table: block %d is at position %d of request %d and at position %d of "
                          "request %d",
                          id, b->start[id], b->owner[id], start, r);
      if (writes || b->written[id])
        return uattn_fail(UATTN_ERR_INCONSISTENT,
                          "broken block table: block %d is written this step by request %d and also used by "
                          "request %d",
                          id, writes ? r : b->owner[id], writes ? b->owner[id] : r);
      b->readers[id] += readers;
    }
  }
  return UATTN_OK;
}

/* ---- phase 2: sizes and bucket -------------------------------------------------------------------- */

typedef struct split_counts {
  int32_t shared_blocks, shared_spans, unique_blocks;
  int32_t unique_span; /* largest unique block id + 1: the seed's unique dimension */
} split_counts;

/* Walks the context blocks once more, now that every block's readers are known. */
static void count_split(uattn_plan *p, const uattn_step *s, const int32_t *ns_of, split_counts *n) {
  const int32_t bs = p->config.block_size;
  uattn_block_scratch *b = &p->blocks;
  memset(n, 0, sizeof *n);
  for (int32_t r = 0; r < s->num_reqs; r++) {
    const request_view q = request_at(p, s, ns_of, r);
    const int32_t nctx = uattn_ceil_div_i32(q.local_cached, bs);
    for (int32_t o = 0; o < nctx; o++) {
      const int32_t id = q.blocks[o];
      if (b->readers[id] > 1) {
        n->shared_spans++;
        if (b->index[id] == -1) {
          b->index[id] = -2; /* counted; its real index comes once the ids are sorted */
          n->shared_blocks++;
        }
      } else {
        n->unique_blocks++;
        if (id + 1 > n->unique_span) n->unique_span = id + 1;
      }
    }
  }
}

static int32_t num_output_tokens(int32_t seq_len, int32_t num_prompt, int32_t ns) {
  return uattn_clamp_i32(seq_len - num_prompt + 1, 0, ns);
}

/* Sampled rows of the step; the async rule adds one when exactly one request samples nothing. */
static int32_t count_logits(const uattn_step *s, const int32_t *ns_of) {
  int32_t n = 0, silent = 0;
  for (int32_t r = 0; r < s->num_reqs; r++) {
    const int32_t out = num_output_tokens(s->num_computed[r] + ns_of[r], s->num_prompt[r], ns_of[r]);
    n += out;
    silent += out == 0;
  }
  return n + (s->async_scheduling && silent == 1);
}

/* ---- phase 3: results ----------------------------------------------------------------------------- */

static int compare_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

static void write_requests_and_tokens(uattn_plan *p, const uattn_step *s, const int32_t *ns_of) {
  const uattn_plan_config *c = &p->config;
  const int32_t bs = c->block_size;
  int32_t row = 0;
  p->query_start_loc[0] = 0;
  for (int32_t r = 0; r < s->num_reqs; r++) {
    const request_view q = request_at(p, s, ns_of, r);
    const int32_t nc = q.nc, ns = q.ns, seq_len = q.seq_len, cached = q.cached, *blocks = q.blocks;
    const bool prompt = q.prompt;
    const int32_t *ids = s->token_ids ? s->token_ids + (int64_t)r * s->token_ids_stride : NULL;
    p->num_scheduled[r] = ns;
    p->seq_lens[r] = seq_len;
    p->is_prompt[r] = prompt;
    p->cached[r] = q.local_cached;
    p->num_output_tokens[r] = num_output_tokens(seq_len, s->num_prompt[r], ns);
    for (int32_t k = 0; k < ns; k++, row++) {
      const int32_t pos = nc + k, local = uattn_cp_local_pos(c, pos);
      p->token_groups[row] = r;
      p->token_offsets[row] = k;
      p->token_positions[row] = pos;
      p->token_context_lens[row] = uattn_cp_local_len(c, uattn_min_i32(pos + 1, cached));
      /* another rank holds the token: it writes nothing here */
      p->slot_mapping[row] = uattn_cp_owns(c, pos) ? (int64_t)blocks[local / bs] * bs + local % bs : -1;
      if (ids) p->token_ids[row] = ids[pos];
    }
    p->query_start_loc[r + 1] = row;
  }
}

/* logits_indices / logits_groups / new_token_positions and the async-scheduling rule (the seed's). */
static int32_t write_logits(uattn_plan *p, const uattn_step *s, int32_t *num_invalid) {
  int32_t n = 0, missing = 0, missing_req = -1;
  for (int32_t r = 0; r < s->num_reqs; r++) {
    const int32_t out = p->num_output_tokens[r], end = p->query_start_loc[r + 1];
    for (int32_t k = 0; k < out; k++, n++) {
      p->logits_indices[n] = end - out + k;
      p->logits_groups[n] = r;
      p->new_token_positions[n] = p->seq_lens[r] - (out - k - 1);
    }
    if (out == 0) {
      missing++;
      missing_req = r;
    }
  }
  *num_invalid = 0;
  if (s->async_scheduling && missing == 1) {
    /* A prompt chunk that does not finish still samples its last token, so the sampler's shapes stay
     * fixed; the engine discards that sample (invalid_req_indices). The seed assumed the partial prompt is
     * the last request; any position is handled here. */
    const int32_t last = p->query_start_loc[missing_req + 1] - 1;
    p->logits_indices[n] = last;
    p->logits_groups[n] = missing_req;
    p->new_token_positions[n] = p->token_positions[last] + 1;
    n++;
    p->invalid_req = missing_req;
    *num_invalid = 1;
  }
  return n;
}

static void write_split(uattn_plan *p, const uattn_step *s) {
  const int32_t bs = p->config.block_size;
  uattn_block_scratch *b = &p->blocks;
  int32_t *shared = p->shared_blocks.data;
  uattn_shared_span *spans = p->shared_spans.data;
  uattn_unique_block *unique = p->unique_blocks.data;
  int32_t *cursor = p->span_cursor.data; /* per shared block: its next span slot */

  /* shared ids in ascending order (the seed's np.unique), then their indices */
  int32_t ns = 0;
  for (int32_t r = 0; r < s->num_reqs; r++) {
    const int32_t *row = s->block_table + (int64_t)r * s->block_table_stride;
    const int32_t nctx = uattn_ceil_div_i32(p->cached[r], bs);
    for (int32_t o = 0; o < nctx; o++)
      if (b->index[row[o]] == -2) {
        b->index[row[o]] = -3;
        shared[ns++] = row[o];
      }
  }
  if (ns > 1) qsort(shared, (size_t)ns, sizeof *shared, compare_i32);
  for (int32_t i = 0; i < ns; i++) {
    b->index[shared[i]] = i;
    cursor[i] = 0;
  }
  /* spans grouped by shared block (counting sort), requests ascending within a block */
  for (int32_t r = 0; r < s->num_reqs; r++) {
    const int32_t *row = s->block_table + (int64_t)r * s->block_table_stride;
    const int32_t nctx = uattn_ceil_div_i32(p->cached[r], bs);
    for (int32_t o = 0; o < nctx; o++)
      if (b->readers[row[o]] > 1) cursor[b->index[row[o]]]++;
  }
  for (int32_t i = 0, sum = 0; i < ns; i++) {
    int32_t c = cursor[i];
    cursor[i] = sum;
    sum += c;
  }
  int32_t nu = 0;
  for (int32_t r = 0; r < s->num_reqs; r++) {
    const int32_t *row = s->block_table + (int64_t)r * s->block_table_stride;
    const int32_t nc = s->num_computed[r], qs = p->query_start_loc[r], qe = p->query_start_loc[r + 1];
    const int32_t nctx = uattn_ceil_div_i32(p->cached[r], bs);
    for (int32_t o = 0; o < nctx; o++) {
      const int32_t id = row[o], start = o * bs;
      const int32_t first = qs + first_reader(&p->config, p->is_prompt[r], nc, start);
      if (b->readers[id] > 1) {
        uattn_shared_span *sp = &spans[cursor[b->index[id]]++];
        sp->shared_index = b->index[id];
        sp->req = r;
        sp->block_start = start;
        sp->token_begin = first;
        sp->token_end = qe;
      } else {
        uattn_unique_block *u = &unique[nu++];
        u->block = id;
        u->token = first;
        u->block_start = start;
        u->usage = uattn_clamp_i32(p->token_context_lens[first] - start, 0, bs);
      }
    }
  }
}

/* The attention's indexes: spans by request, unique blocks by row, requests by cost. */
static int64_t request_cost(const uattn_plan *p, int32_t r) {
  /* visible (row, key) pairs: each row sees the context before the step plus the rows up to its own */
  const int64_t rows = p->query_start_loc[r + 1] - p->query_start_loc[r];
  return rows * ((int64_t)p->seq_lens[r] - rows) + rows * (rows + 1) / 2;
}

static int compare_cost(const void *a, const void *b) {
  const uattn_cost_key *x = a, *y = b;
  if (x->cost != y->cost) return x->cost > y->cost ? -1 : 1;
  return (x->first > y->first) - (x->first < y->first);
}

/* Key ranges a request's context is split into (1: not split). */
static int32_t request_splits(const uattn_plan *p, int32_t r) {
  const int32_t rows = p->query_start_loc[r + 1] - p->query_start_loc[r];
  return !p->is_prompt[r] && rows <= UATTN_SPLIT_MAX_ROWS && p->cached[r] >= p->config.split_min_keys
             ? uattn_ceil_div_i32(p->cached[r], p->config.split_keys)
             : 1;
}

/* The shared block a request's context starts on, or -1: the key of prefix runs (schedule.h). A run only
 * takes requests without causal rows, and is not split: a common prefix read once for many rows beats
 * splitting each row's context for parallelism (the run's rows and KV heads are work enough). */
static int32_t prefix_run_key(const uattn_plan *p, int32_t r) {
  if (p->is_prompt[r] || p->span_req_begin[r] == p->span_req_begin[r + 1]) return -1;
  const uattn_shared_span *spans = p->shared_spans.data;
  return spans[((const int32_t *)p->spans_by_req.data)[p->span_req_begin[r]]].shared_index;
}

static void write_indexes(uattn_plan *p, const uattn_step *s, int32_t num_spans, int32_t num_unique,
                          int32_t num_tokens) {
  const uattn_shared_span *spans = p->shared_spans.data;
  int32_t *order = p->spans_by_req.data, *begin = p->span_req_begin;
  memset(begin, 0, sizeof(int32_t) * ((size_t)s->num_reqs + 1));
  for (int32_t k = 0; k < num_spans; k++) begin[spans[k].req + 1]++;
  for (int32_t r = 0; r < s->num_reqs; r++) begin[r + 1] += begin[r];
  int32_t *cursor = p->item_first; /* borrowed: filled for real below */
  for (int32_t r = 0; r < s->num_reqs; r++) cursor[r] = begin[r];
  for (int32_t k = 0; k < num_spans; k++) order[cursor[spans[k].req]++] = k;

  const uattn_unique_block *unique = p->unique_blocks.data;
  for (int32_t row = 0, k = 0; row <= num_tokens; row++) {
    while (k < num_unique && unique[k].token < row) k++;
    p->unique_row_begin[row] = k;
  }
  /* items: consecutive requests with the same prefix run key and at most UATTN_PREFIX_RUN_MAX_ROWS rows together;
   * every other request alone */
  uattn_cost_key *keys = p->cost_keys;
  int32_t n = 0;
  for (int32_t r = 0; r < s->num_reqs;) {
    const int32_t key = prefix_run_key(p, r);
    int32_t end = r + 1;
    while (key >= 0 && end < s->num_reqs && prefix_run_key(p, end) == key &&
           p->query_start_loc[end + 1] - p->query_start_loc[r] <= UATTN_PREFIX_RUN_MAX_ROWS)
      end++;
    keys[n] = (uattn_cost_key){0, r, end - r};
    for (; r < end; r++) keys[n].cost += request_cost(p, r);
    n++;
  }
  /* largest first, ties by request: the attention hands out its work in this order, so the longest items
   * start first */
  if (n > 1) qsort(keys, (size_t)n, sizeof *keys, compare_cost);
  p->num_items = n;
  p->split_begin[0] = p->split_slot[0] = 0;
  for (int32_t i = 0; i < n; i++) {
    p->item_first[i] = keys[i].first;
    p->item_reqs[i] = keys[i].reqs;
    const int32_t r = keys[i].first, splits = keys[i].reqs == 1 ? request_splits(p, r) : 1;
    p->split_begin[i + 1] = p->split_begin[i] + splits;
    /* a (row, split) slot for each row of each split */
    p->split_slot[i + 1] =
        p->split_slot[i] + (splits > 1 ? splits * (p->query_start_loc[r + 1] - p->query_start_loc[r]) : 0);
  }
}

/* ---- the step ------------------------------------------------------------------------------------- */

/* The whole of draft_offsets is checked before any draft is read: offsets that rise and fall back to their
 * start ({0, 2, 0}) list drafts although the first and last are equal, so those two alone cannot say
 * whether draft_tokens is needed. */
static uattn_status validate_draft_offsets(const uattn_step *s) {
  const int32_t *o = s->draft_offsets;
  if (!o) return UATTN_OK;
  if (o[0] < 0) return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "step.draft_offsets[0] = %d must be >= 0", o[0]);
  for (int32_t r = 0; r < s->num_reqs; r++)
    if (o[r + 1] < o[r])
      return uattn_fail(UATTN_ERR_INVALID_ARGUMENT,
                        "step.draft_offsets must be non-decreasing (CSR offsets, num_reqs + 1 of them): "
                        "draft_offsets[%d] = %d < draft_offsets[%d] = %d",
                        r + 1, o[r + 1], r, o[r]);
  if (o[s->num_reqs] > o[0]) UATTN_CHECK_PTR(s->draft_tokens, "step.draft_tokens (draft_offsets lists drafts)");
  return UATTN_OK;
}

static uattn_status validate_step_pointers(const uattn_plan *p, const uattn_step *s) {
  if (s->num_reqs < 0) return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "step.num_reqs = %d must be >= 0", s->num_reqs);
  if (s->num_reqs > p->config.max_num_seqs)
    return uattn_fail(UATTN_ERR_CAPACITY, "step.num_reqs = %d exceeds the plan's max_num_seqs %d", s->num_reqs,
                      p->config.max_num_seqs);
  if (s->num_reqs == 0) return UATTN_OK;
  UATTN_CHECK_PTR(s->num_computed, "step.num_computed");
  UATTN_CHECK_PTR(s->num_scheduled, "step.num_scheduled");
  UATTN_CHECK_PTR(s->num_prompt, "step.num_prompt");
  UATTN_CHECK_PTR(s->block_table, "step.block_table");
  UATTN_CHECK_ALIGNED(s->token_ids, "step.token_ids");
  UATTN_CHECK_ALIGNED(s->draft_offsets, "step.draft_offsets");
  if (s->block_table_stride <= 0)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "step.block_table_stride = %d must be > 0", s->block_table_stride);
  if (s->token_ids && s->token_ids_stride <= 0)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "step.token_ids_stride = %d must be > 0 when token_ids is given",
                      s->token_ids_stride);
  return validate_draft_offsets(s);
}

uattn_status uattn_plan_step(uattn_plan *p, const uattn_step *s) {
  uattn_clear_error();
  UATTN_CHECK_PTR(p, "plan");
  UATTN_CHECK_PTR(s, "step");
  uattn_status st = validate_step_pointers(p, s);
  if (st) return st;

  /* phase 1: validate (num_scheduled after the spec-decode rule goes to scratch, not to the results) */
  int32_t *ns_of = p->step_scheduled;
  step_shape shape = {0, false};
  if ((st = validate_requests(p, s, ns_of, &shape))) return st;
  if ((st = validate_blocks(p, s, ns_of))) return st;

  /* phase 2: sizes, bucket, capacity */
  split_counts n;
  count_split(p, s, ns_of, &n);
  const int32_t num_logits = count_logits(s, ns_of);
  uattn_bucket exact = {shape.num_tokens, n.shared_blocks, n.unique_span, num_logits}, padded;
  bool fallback = false;
  if ((st = uattn_batch_bucket_select(p, shape.contains_prompts, &exact, &padded, &fallback))) return st;

  if ((st = uattn_buf_reserve(&p->alloc, &p->shared_blocks, (size_t)n.shared_blocks * sizeof(int32_t))) ||
      (st = uattn_buf_reserve(&p->alloc, &p->span_cursor, (size_t)n.shared_blocks * sizeof(int32_t))) ||
      (st = uattn_buf_reserve(&p->alloc, &p->shared_spans, (size_t)n.shared_spans * sizeof(uattn_shared_span))) ||
      (st = uattn_buf_reserve(&p->alloc, &p->spans_by_req, (size_t)n.shared_spans * sizeof(int32_t))) ||
      (st = uattn_buf_reserve(&p->alloc, &p->unique_blocks, (size_t)n.unique_blocks * sizeof(uattn_unique_block))))
    return st;

  /* phase 3: write (nothing below can fail) */
  write_requests_and_tokens(p, s, ns_of);
  int32_t num_invalid;
  int32_t logits = write_logits(p, s, &num_invalid);
  write_split(p, s);
  write_indexes(p, s, n.shared_spans, n.unique_blocks, shape.num_tokens);

  uattn_plan_info *info = &p->info;
  info->block_size = p->config.block_size;
  info->num_reqs = s->num_reqs;
  info->num_tokens = shape.num_tokens;
  info->contains_prompts = shape.contains_prompts;
  info->num_scheduled = p->num_scheduled;
  info->query_start_loc = p->query_start_loc;
  info->seq_lens = p->seq_lens;
  info->is_prompt = p->is_prompt;
  info->num_output_tokens = p->num_output_tokens;
  info->token_groups = p->token_groups;
  info->token_offsets = p->token_offsets;
  info->token_positions = p->token_positions;
  info->token_ids = s->token_ids ? p->token_ids : NULL;
  info->slot_mapping = p->slot_mapping;
  info->token_context_lens = p->token_context_lens;
  info->num_logits = logits;
  info->logits_indices = p->logits_indices;
  info->logits_groups = p->logits_groups;
  info->new_token_positions = p->new_token_positions;
  info->num_invalid_reqs = num_invalid;
  info->invalid_req_indices = &p->invalid_req;
  info->num_shared_blocks = n.shared_blocks;
  info->shared_blocks = p->shared_blocks.data;
  info->num_shared_spans = n.shared_spans;
  info->shared_spans = p->shared_spans.data;
  info->num_unique_blocks = n.unique_blocks;
  info->unique_blocks = p->unique_blocks.data;
  info->exact = exact;
  info->padded = padded;
  info->bucket_fallback = fallback;
  p->stats.steps++;
  p->stats.bucket_fallbacks += fallback;
  return UATTN_OK;
}

uattn_status uattn_plan_get_info(const uattn_plan *plan, uattn_plan_info *info) {
  uattn_clear_error();
  UATTN_CHECK_PTR(plan, "plan");
  UATTN_CHECK_PTR(info, "info");
  *info = plan->info;
  return UATTN_OK;
}

uattn_status uattn_plan_get_stats(const uattn_plan *plan, uattn_plan_stats *stats) {
  uattn_clear_error();
  UATTN_CHECK_PTR(plan, "plan");
  UATTN_CHECK_PTR(stats, "stats");
  *stats = plan->stats;
  stats->allocations = plan->alloc.count;
  stats->bytes_reserved = plan->alloc.bytes;
  return UATTN_OK;
}

uattn_status uattn_plan_schedule(const uattn_plan *p, uattn_schedule *out) {
  UATTN_CHECK_PTR(p, "plan");
  *out = (uattn_schedule){.config = &p->config,
                          .info = &p->info,
                          .num_items = p->num_items,
                          .item_first = p->item_first,
                          .item_reqs = p->item_reqs,
                          .split_begin = p->split_begin,
                          .split_slot = p->split_slot,
                          .split_keys = p->config.split_keys,
                          .spans_by_req = p->spans_by_req.data,
                          .span_req_begin = p->span_req_begin,
                          .unique_row_begin = p->unique_row_begin};
  return UATTN_OK;
}
