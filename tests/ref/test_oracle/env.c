/* The oracle suite's step builder (env.h): a step with its own buffers, its keys and queries set element by
 * element, the oracle run on it, and its outputs read back. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/support.h"
#include "env.h"
uattn_layer layer(int32_t hq, int32_t hkv, int32_t d, uattn_dtype dtype) {
  return (uattn_layer){.num_q_heads = hq,
                       .num_kv_heads = hkv,
                       .head_dim = d,
                       .scale = 1.0f,
                       .dtype = dtype,
                       .cache_dtype = dtype,
                       .kv_layout = UATTN_LAYOUT_NHD,
                       .attn_type = UATTN_ATTENTION_DECODER};
}

static int32_t ceil_div(int32_t a, int32_t b) { return (a + b - 1) / b; }

void env_init(env *e, uattn_layer L, int32_t R, const int32_t *nc, const int32_t *ns, const int32_t *enc, int32_t bs,
              uint64_t seed) {
  memset(e, 0, sizeof *e);
  e->L = L;
  e->R = R;
  e->bs = bs;
  int32_t cols = 1;
  for (int32_t r = 0; r < R; r++) {
    e->nc[r] = nc[r];
    e->ns[r] = ns[r];
    e->enc[r] = enc ? enc[r] : 0;
    e->qs[r + 1] = e->qs[r] + ns[r];
    if (ceil_div(nc[r] + ns[r], bs) > cols) cols = ceil_div(nc[r] + ns[r], bs);
    if (ceil_div(e->enc[r], bs) > cols) cols = ceil_div(e->enc[r], bs);
  }
  cr_assert(R <= MAXR && cols + 1 <= MAXCOL, "test step too large");
  e->T = e->qs[R];
  e->stride = cols + 1;
  e->nb = 2 * R * e->stride + 3;
  int32_t *perm = malloc((size_t)e->nb * sizeof *perm);
  for (int32_t i = 0; i < e->nb; i++) perm[i] = i;
  test_rng rng = {seed};
  for (int32_t i = e->nb - 1; i > 0; i--) {
    int32_t j = test_rng_range(&rng, 0, i), x = perm[i];
    perm[i] = perm[j];
    perm[j] = x;
  }
  int32_t next = 0;
  for (int32_t r = 0; r < R; r++) {
    for (int32_t c = 0; c < e->stride; c++) {
      e->bt[r * e->stride + c] = c < ceil_div(nc[r] + ns[r], bs) ? perm[next++] : -1;
      e->cbt[r * e->stride + c] = c < ceil_div(e->enc[r], bs) ? perm[next++] : -1;
    }
  }
  free(perm);
  /* buffers as wide as the wider of keys and values (head_dim_v), so one size serves both caches */
  const size_t Dv = (size_t)oracle_value_dim(&L), D = (size_t)L.head_dim > Dv ? (size_t)L.head_dim : Dv;
  const size_t hq = (size_t)L.num_q_heads, hkv = (size_t)L.num_kv_heads;
  const size_t es = oracle_dtype_size(L.dtype), ces = oracle_dtype_size(L.cache_dtype), T = (size_t)e->T;
  e->cache_elems = (size_t)e->nb * (size_t)bs * hkv * D;
  e->t.q = e->q = calloc(T * hq * D + 1, es);
  e->t.k = e->k = calloc(T * hkv * D + 1, es);
  e->t.v = e->v = calloc(T * hkv * D + 1, es);
  e->t.key_cache = e->kc = malloc(e->cache_elems * ces);
  e->t.value_cache = e->vc = malloc(e->cache_elems * ces);
  for (size_t i = 0; i < e->cache_elems; i++) {
    oracle_store(e->t.key_cache, L.cache_dtype, i, NAN);
    oracle_store(e->t.value_cache, L.cache_dtype, i, NAN);
  }
  e->t.num_blocks = e->nb;
  e->cross = (uattn_cross){.encoder_lens = e->enc, .block_table = e->cbt, .block_table_stride = e->stride};
  e->t.cross = &e->cross;
  e->s = (oracle_step){.num_reqs = R,
                       .block_size = bs,
                       .num_computed = e->nc,
                       .num_scheduled = e->ns,
                       .num_prompt = NULL,
                       .block_table = e->bt,
                       .block_table_stride = e->stride};
  e->out = malloc((T * hq * D + 1) * sizeof *e->out);
  e->lse = malloc((T * hq + 1) * sizeof *e->lse);
}

void env_free(env *e) {
  free(e->q);
  free(e->k);
  free(e->v);
  free(e->kc);
  free(e->vc);
  free(e->out);
  free(e->lse);
}

size_t slot_index(const env *e, int64_t slot, int32_t g, int32_t d, bool v) {
  const size_t hkv = (size_t)e->L.num_kv_heads, bs = (size_t)e->bs;
  const size_t D = v ? (size_t)oracle_value_dim(&e->L) : (size_t)e->L.head_dim; /* each cache's row width */
  const size_t block = (size_t)slot / bs, off = (size_t)slot % bs;
  if (e->L.kv_layout == UATTN_LAYOUT_HND) return ((block * hkv + (size_t)g) * bs + off) * D + (size_t)d;
  if (e->L.kv_layout == UATTN_LAYOUT_TILED) {
    const size_t tiles = bs / 16, tile = off / 16, key = off % 16;
    const size_t head = (block * tiles + tile) * hkv + (size_t)g; /* the (block, tile, head) group of 16 keys */
    if (v) return head * 16 * D + (key / 2) * 2 * D + (size_t)d * 2 + key % 2;
    return head * 16 * D + ((size_t)d / 2) * 32 + key * 2 + (size_t)d % 2;
  }
  return (block * bs * hkv + off * hkv + (size_t)g) * D + (size_t)d;
}

int64_t slot_of(const env *e, bool cross, int32_t r, int32_t j) {
  const int32_t *table = cross ? e->cbt : e->bt;
  return (int64_t)table[r * e->stride + j / e->bs] * e->bs + j % e->bs;
}

void set_q(env *e, int32_t row, int32_t h, const double *x) {
  const size_t D = (size_t)e->L.head_dim;
  for (size_t d = 0; d < D; d++)
    oracle_store(e->q, e->L.dtype, ((size_t)row * (size_t)e->L.num_q_heads + (size_t)h) * D + d, x[d]);
}

void set_kv(env *e, int32_t row, int32_t g, const double *k, const double *v) {
  const size_t D = (size_t)e->L.head_dim, Dv = (size_t)oracle_value_dim(&e->L);
  const size_t at = (size_t)row * (size_t)e->L.num_kv_heads + (size_t)g;
  for (size_t d = 0; d < D; d++) oracle_store(e->k, e->L.dtype, at * D + d, k[d]);
  for (size_t d = 0; d < Dv && !e->L.kv_latent; d++) oracle_store(e->v, e->L.dtype, at * Dv + d, v[d]);
}

void set_cache(env *e, bool cross, int32_t r, int32_t j, int32_t g, const double *k, const double *v) {
  const int64_t slot = slot_of(e, cross, r, j);
  for (int32_t d = 0; d < e->L.head_dim; d++)
    oracle_store(e->t.key_cache, e->L.cache_dtype, slot_index(e, slot, g, d, false), k[d]);
  for (int32_t d = 0; d < oracle_value_dim(&e->L) && !e->L.kv_latent; d++)
    oracle_store(e->t.value_cache, e->L.cache_dtype, slot_index(e, slot, g, d, true), v[d]);
}

void env_run(env *e) {
  cr_assert_eq(oracle_write_cache(&e->s, &e->L, &e->t), 0, "write_cache: %s", oracle_last_error());
  cr_assert_eq(oracle_attention(&e->s, &e->L, &e->t, e->out, e->lse), 0, "attention: %s", oracle_last_error());
}

const double *out_at(const env *e, int32_t row, int32_t h) {
  return e->out + ((size_t)row * (size_t)e->L.num_q_heads + (size_t)h) * (size_t)oracle_value_dim(&e->L);
}
double lse_at(const env *e, int32_t row, int32_t h) { return e->lse[row * e->L.num_q_heads + h]; }

void expect_out(const env *e, int32_t row, int32_t h, const double *want, double tol) {
  const double *got = out_at(e, row, h);
  for (int32_t d = 0; d < oracle_value_dim(&e->L); d++)
    cr_assert(fabs(got[d] - want[d]) <= tol, "row %d head %d out[%d] = %.17g, expected %.17g", row, h, d, got[d],
              want[d]);
}

void expect_lse(const env *e, int32_t row, int32_t h, double want, double tol) {
  const double got = lse_at(e, row, h);
  if (isinf(want))
    cr_assert(got == want, "row %d head %d lse = %.17g, expected %g", row, h, got, want);
  else
    cr_assert(fabs(got - want) <= tol, "row %d head %d lse = %.17g, expected %.17g", row, h, got, want);
}

void zero_keys_step(env *e, int32_t r, bool cache_too) {
  const int32_t D = e->L.head_dim;
  double zero[8] = {0}, v[8] = {0};
  for (int32_t j = 0; j < e->nc[r] + e->ns[r]; j++) {
    v[0] = j;
    v[1] = 10 + j;
    for (int32_t g = 0; g < e->L.num_kv_heads; g++) {
      if (j < e->nc[r]) {
        if (cache_too) set_cache(e, false, r, j, g, zero, v);
      } else {
        set_kv(e, e->qs[r] + j - e->nc[r], g, zero, v);
      }
    }
  }
  for (int32_t i = 0; i < e->ns[r]; i++)
    for (int32_t h = 0; h < e->L.num_q_heads; h++) set_q(e, e->qs[r] + i, h, (double[]){1, -2, 3, 4, 5, 6, 7, 8});
  (void)D;
}
