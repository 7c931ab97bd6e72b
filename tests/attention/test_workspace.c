/* Memory stays bounded by threads x tile, whatever the number of shared blocks: PR 784's scenario
 * (thousands of shared blocks read by a thousand query rows), where the seed's shared bias alone would be
 * rows x shared blocks x block size floats. Every byte the runtime's workers allocate goes through a
 * counting allocator; the answer is checked on sampled rows against a dense fp64 evaluation. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "uattn.h"
#include "support/requests.h"

typedef struct counting {
  atomic_size_t live, peak, calls;
} counting;

static void *count_alloc(void *user, size_t bytes) {
  counting *c = user;
  size_t *p = NULL;
  if (posix_memalign((void **)&p, 64, bytes + 64)) return NULL;
  p[0] = bytes;
  const size_t now = atomic_fetch_add(&c->live, bytes) + bytes;
  size_t peak = atomic_load(&c->peak);
  while (now > peak && !atomic_compare_exchange_weak(&c->peak, &peak, now)) {
  }
  atomic_fetch_add(&c->calls, 1);
  return (char *)p + 64;
}

static void count_free(void *user, void *ptr) {
  if (!ptr) return;
  counting *c = user;
  size_t *p = (size_t *)((char *)ptr - 64);
  atomic_fetch_sub(&c->live, p[0]);
  free(p);
}

enum {
  BS = 8,
  PREFIX = 16384, /* 2048 shared blocks */
  DECODES = 768,  /* decodes on the prefix, 8 keys of their own */
  CHUNKS = 2,
  CHUNK = 128, /* prompt chunks after the prefix */
  HQ = 2,
  HKV = 1,
  D = 16,
};

static float value_at(uint64_t i, uint64_t salt) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + salt;
  z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
  return (float)((z >> 40) & 0xffff) / 65536.0f - 0.5f;
}

Test(workspace, pr784_thousands_of_shared_blocks_in_bounded_memory, .timeout = 300) {
  const int32_t reqs = DECODES + CHUNKS, prefix_blocks = PREFIX / BS;
  const int32_t stride = prefix_blocks + CHUNK / BS + 1;
  int32_t *nc = calloc((size_t)reqs, 4), *ns = calloc((size_t)reqs, 4), *np = calloc((size_t)reqs, 4);
  int32_t *table = malloc(sizeof(int32_t) * (size_t)reqs * stride);
  int32_t next = prefix_blocks;
  for (int32_t r = 0; r < reqs; r++) {
    const bool chunk = r < CHUNKS;
    nc[r] = chunk ? PREFIX : PREFIX + BS - 1; /* a decode: one block of its own, its new key at the end */
    ns[r] = chunk ? CHUNK : 1;
    np[r] = chunk ? PREFIX + CHUNK : 1;
    const int32_t need = (nc[r] + ns[r] + BS - 1) / BS;
    for (int32_t b = 0; b < stride; b++)
      table[(size_t)r * stride + b] = b >= need ? -1 : b < prefix_blocks ? b : next++;
  }
  const int32_t tokens = CHUNKS * CHUNK + DECODES, num_blocks = next;
  uattn_plan_config cfg = uattn_plan_config_default(BS, num_blocks, reqs, tokens, PREFIX + CHUNK + BS);
  uattn_plan *plan;
  cr_assert_eq(uattn_plan_create(&cfg, &plan), UATTN_OK, "%s", uattn_last_error());
  const uattn_step step = step_requests(reqs, nc, ns, np, table, stride);
  cr_assert_eq(uattn_plan_step(plan, &step), UATTN_OK, "%s", uattn_last_error());
  uattn_plan_info in;
  uattn_plan_get_info(plan, &in);
  cr_assert_geq(in.num_shared_blocks, 2000, "the scenario needs thousands of shared blocks");

  const size_t cache = (size_t)num_blocks * BS * HKV * D;
  float *kc = malloc(cache * 4), *vc = malloc(cache * 4);
  for (size_t i = 0; i < cache; i++) kc[i] = value_at(i, 1), vc[i] = value_at(i, 2);
  float *q = malloc(sizeof(float) * tokens * HQ * D), *k = malloc(sizeof(float) * tokens * HKV * D);
  float *v = malloc(sizeof(float) * tokens * HKV * D), *out = malloc(sizeof(float) * tokens * HQ * D);
  for (size_t i = 0; i < (size_t)tokens * HQ * D; i++) q[i] = 4.0f * value_at(i, 3);
  for (size_t i = 0; i < (size_t)tokens * HKV * D; i++) k[i] = value_at(i, 4), v[i] = value_at(i, 5);

  counting count = {0};
  const uattn_allocator alloc = {count_alloc, count_free, &count};
  uattn_runtime_config rc = uattn_runtime_config_default();
  rc.num_threads = 2;
  rc.allocator = &alloc;
  uattn_runtime *rt;
  cr_assert_eq(uattn_runtime_create(&rc, &rt), UATTN_OK, "%s", uattn_last_error());
  const size_t before = atomic_load(&count.peak);
  const uattn_layer L = uattn_layer_default(HQ, HKV, D, UATTN_F32);
  const uattn_tensors t = {q, k, v, kc, vc, num_blocks, BS, out, NULL, NULL};
  cr_assert_eq(uattn_forward(plan, &L, &t, rt), UATTN_OK, "%s", uattn_last_error());
  uattn_kernel_report rep;
  cr_assert_eq(uattn_last_forward_report(&rep), UATTN_OK);
  const size_t scratch = atomic_load(&count.peak) - before;
  const double seed_bias = (double)tokens * in.num_shared_blocks * BS * sizeof(float);
  cr_log_info(
      "%d rows, %d shared blocks: %zu bytes of worker scratch in all (%zu a worker), where the seed's "
      "shared bias alone is %.0f MiB",
      tokens, in.num_shared_blocks, scratch, rep.workspace_bytes, seed_bias / (1 << 20));
  cr_assert_leq(scratch, (size_t)16 << 20, "worker scratch %zu bytes: it must not grow with the shared blocks",
                scratch);
  cr_assert_leq(rep.workspace_bytes * 2, scratch + 4096);

  /* sampled rows against fp64: a prompt row (prefix + its chunk) and decodes (prefix + their own keys) */
  const int32_t rows[] = {0, CHUNK - 1, CHUNK + 5, CHUNKS * CHUNK, tokens / 2, tokens - 1};
  for (size_t s = 0; s < sizeof rows / sizeof *rows; s++) {
    const int32_t row = rows[s], r = in.token_groups[row], pos = in.token_positions[row];
    for (int32_t h = 0; h < HQ; h++) {
      double m = -INFINITY, l = 0, o[D] = {0};
      double *sc = malloc(sizeof(double) * (size_t)(pos + 1));
      for (int pass = 0; pass < 2; pass++)
        for (int32_t j = 0; j <= pos; j++) {
          const float *kk, *vv;
          if (np[r] > 1 && j >= nc[r]) { /* a prompt row reads this step's keys from k and v */
            const int32_t krow = row - (pos - j);
            kk = k + (size_t)krow * HKV * D, vv = v + (size_t)krow * HKV * D;
          } else {
            const size_t slot = (size_t)table[(size_t)r * stride + j / BS] * BS + j % BS;
            kk = kc + slot * HKV * D, vv = vc + slot * HKV * D;
          }
          if (pass == 0) {
            double dot = 0;
            for (int d = 0; d < D; d++) dot += (double)q[((size_t)row * HQ + h) * D + d] * kk[d];
            sc[j] = dot * L.scale;
            m = fmax(m, sc[j]);
          } else {
            const double p = exp(sc[j] - m);
            l += p;
            for (int d = 0; d < D; d++) o[d] += p * vv[d];
          }
        }
      for (int d = 0; d < D; d++)
        cr_assert(fabs(o[d] / l - out[((size_t)row * HQ + h) * D + d]) <= 1e-5,
                  "row %d head %d dim %d: %.7g, fp64 %.7g", row, h, d, out[((size_t)row * HQ + h) * D + d], o[d] / l);
      free(sc);
    }
  }
  uattn_runtime_destroy(rt);
  cr_assert_eq(atomic_load(&count.live), 0, "the runtime returned everything it allocated");
  uattn_plan_destroy(plan);
  free(nc), free(ns), free(np), free(table), free(kc), free(vc), free(q), free(k), free(v), free(out);
}
