/* libFuzzer target: uattn_forward's validation, on a small plan (up to three requests planned from the
 * input; a step the planner refuses leaves the previous one) and a layer and tensors decoded from the
 * input: head counts and head dims at and past their limits, enums out of range, non-finite scales, NULL
 * and misaligned buffers, caches smaller than the plan, block-size mismatches, cross-attention tables with
 * bad entries. Buffers are exactly as long as the layer and the tensors' own fields say (a caller's buffer
 * shorter than it claims is the caller's bug, which no library can see). Any status is fine; besides
 * crashes, a refused call that wrote to the caches, out or lse, or that gives no message, is a finding. */
#include <stdio.h>

#include "fuzz_input.h"
#include "support/requests.h"
#include "uattn.h"

#define BLOCKS 64 /* the plan's cache; each request's rows are a disjoint range of 16 blocks */
#define STRIDE 16
#define MAX_REQS 3

static uattn_runtime *rt;

static void fail(const char *what) {
  fprintf(stderr, "fuzz_forward: %s (%s)\n", what, uattn_last_error());
  abort();
}

static void cleanup(void) { uattn_runtime_destroy(rt); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  uattn_runtime_config c = uattn_runtime_config_default();
  c.num_threads = 1; /* this target runs beside other work: one core */
  c.pin = false;
  c.spin_us = 0;
  if (uattn_runtime_create(&c, &rt) != UATTN_OK) fail("cannot create a runtime");
  atexit(cleanup);
  return 0;
}

/* A step of up to MAX_REQS requests: prompts, chunked prompts and decodes, each on its own blocks, with
 * the first blocks of request 0 shared by the others when the input says so. */
static uattn_status plan_step(fuzz_input *in, uattn_plan *plan, int32_t block_size, int32_t *num_reqs) {
  int32_t nc[MAX_REQS], ns[MAX_REQS], np[MAX_REQS], table[MAX_REQS * STRIDE];
  const int32_t n = fuzz_range(in, 0, MAX_REQS), shared = fuzz_range(in, 0, 3);
  for (int32_t r = 0; r < n; r++) {
    nc[r] = fuzz_range(in, 0, 10);
    ns[r] = fuzz_range(in, 1, 4);
    np[r] = fuzz_bool(in) ? nc[r] + ns[r] + fuzz_range(in, 0, 2) : (nc[r] > 0 ? nc[r] : 1);
    for (int32_t i = 0; i < STRIDE; i++) table[r * STRIDE + i] = r > 0 && i < shared ? i : r * STRIDE + i;
  }
  (void)block_size;
  uattn_step s = step_requests(n, nc, ns, np, table, STRIDE);
  *num_reqs = n;
  return uattn_plan_step(plan, &s);
}

/* an element's bytes (4 for an invalid dtype, which the forward refuses): the buffers are exactly as long as
 * the layer says, so a read past them is caught */
static size_t dtype_bytes(uattn_dtype d) {
  return d == UATTN_BF16 || d == UATTN_F16 ? 2 : d == UATTN_FP8_E4M3 || d == UATTN_FP8_E5M2 ? 1 : 4;
}
static size_t positive(int64_t v) { return v > 0 ? (size_t)v : 0; }

/* A buffer of bytes, pattern-filled, offset by `skew` bytes from its 64-byte-aligned start (skew 0..3). */
typedef struct buffer {
  uint8_t *base;
  void *ptr;
  size_t bytes;
} buffer;

static buffer make_buffer(fuzz_input *in, size_t bytes, bool may_skew) {
  buffer b;
  const size_t skew = may_skew && fuzz_u8(in) >= 224 ? (size_t)fuzz_range(in, 1, 3) : 0;
  b.base = aligned_alloc(64, (bytes + skew + 64) / 64 * 64);
  if (!b.base) abort();
  memset(b.base, FUZZ_PATTERN, bytes + skew);
  b.ptr = b.base + skew;
  b.bytes = bytes;
  return b;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_input in = {data, size, 0};
  static const int32_t block_sizes[] = {1, 2, 4, 16};
  const int32_t bs = block_sizes[fuzz_range(&in, 0, 3)];
  uattn_plan_config pc = uattn_plan_config_default(bs, BLOCKS, MAX_REQS, 32, STRIDE * bs);
  pc.chunk_size = fuzz_range(&in, 0, 2);
  pc.split_min_keys = fuzz_range(&in, 0, 12); /* low thresholds put short decodes through split-K */
  pc.split_keys = fuzz_range(&in, 0, 6);
  uattn_plan *plan;
  if (uattn_plan_create(&pc, &plan) != UATTN_OK) fail("a valid plan config was refused");
  int32_t num_reqs = 0;
  for (int k = fuzz_range(&in, 1, 2); k > 0; k--)
    if (plan_step(&in, plan, bs, &num_reqs) != UATTN_OK) num_reqs = 0; /* the plan keeps its previous step */
  uattn_plan_info info;
  uattn_plan_get_info(plan, &info);
  num_reqs = info.num_reqs;
  const size_t T = (size_t)info.num_tokens;

  static const int32_t q_heads[] = {-1, 0, 1, 2, 3, 4, 8, 2}, kv_heads[] = {-1, 0, 1, 2, 3, 1, 1, 1};
  static const int32_t head_dims[] = {-1, 0, 1, 3, 4, 8, 16, 64, 80, 128, 256, 4097, 128, 64, 8, 16};
  uattn_layer L = uattn_layer_default(q_heads[fuzz_range(&in, 0, 7)], kv_heads[fuzz_range(&in, 0, 7)],
                                      head_dims[fuzz_range(&in, 0, 15)], (uattn_dtype)fuzz_range(&in, 0, 5));
  L.cache_dtype = (uattn_dtype)fuzz_range(&in, 0, 5);   /* every dtype (fp8 a cache's only) and an invalid one */
  L.kv_layout = (uattn_kv_layout)fuzz_range(&in, 0, 3); /* NHD, HND, TILED (block 16 only) and an invalid one */
  L.attn_type = (uattn_attention_type)fuzz_range(&in, -1, 4);
  const uint8_t opts = fuzz_u8(&in);
  if (opts & 1) L.scale = fuzz_float(&in);
  if (opts & 2) L.soft_cap = fuzz_float(&in);
  if (opts & 4) L.sliding_window = fuzz_count(&in, 0, 8);
  if (opts & 8) L.causal_width = fuzz_count(&in, 0, 4);
  if (opts & 16) L.chunk_size = fuzz_count(&in, 0, 2);
  const size_t hq = positive(L.num_q_heads), hkv = positive(L.num_kv_heads), d = positive(L.head_dim);
  const size_t io = dtype_bytes(L.dtype), cache = dtype_bytes(L.cache_dtype);
  buffer sinks = make_buffer(&in, 4 * hq, true), alibi = make_buffer(&in, 4 * hq, true);
  if (opts & 32) L.sinks = sinks.ptr;
  if (opts & 64) L.alibi_slopes = alibi.ptr;

  uattn_tensors t;
  memset(&t, 0, sizeof t);
  static const int32_t cache_blocks[] = {BLOCKS, BLOCKS, BLOCKS, 1, 8, 0, -1, BLOCKS + 1};
  t.num_blocks = cache_blocks[fuzz_range(&in, 0, 7)];
  t.block_size = fuzz_u8(&in) < 240 ? bs : fuzz_count(&in, 0, 8);
  /* a block size other than the plan's is refused before the caches are read: they hold blocks of 1 */
  const size_t cache_bytes = positive(t.num_blocks) * (t.block_size == bs ? (size_t)bs : 1) * hkv * d * cache;
  buffer q = make_buffer(&in, T * hq * d * io, true), k = make_buffer(&in, T * hkv * d * io, true),
         v = make_buffer(&in, T * hkv * d * io, true), out = make_buffer(&in, T * hq * d * io, true),
         lse = make_buffer(&in, T * hq * 4, true), kc = make_buffer(&in, cache_bytes, true),
         vc = make_buffer(&in, cache_bytes, true);
  const uint8_t nulls = fuzz_u8(&in);
  t.q = nulls & 1 ? NULL : q.ptr;
  t.k = nulls & 2 ? NULL : k.ptr;
  t.v = nulls & 4 ? NULL : v.ptr;
  t.out = nulls & 8 ? NULL : out.ptr;
  t.key_cache = nulls & 16 ? NULL : kc.ptr;
  t.value_cache = nulls & 32 ? NULL : vc.ptr;
  t.lse = nulls & 64 ? lse.ptr : NULL;

  uattn_cross cross;
  int32_t *encoder_lens = fuzz_ints(&in, num_reqs, 0, 40), *cross_table = NULL;
  cross.block_table_stride = fuzz_size(&in, 0, 4);
  const int32_t cross_cols =
      cross.block_table_stride > 0 && cross.block_table_stride <= 4 ? cross.block_table_stride : 0;
  cross_table = fuzz_ints(&in, num_reqs * cross_cols, -1, BLOCKS);
  cross.encoder_lens = nulls & 128 ? NULL : encoder_lens;
  cross.block_table = cross_table;
  if (fuzz_bool(&in)) t.cross = &cross;

  const uint8_t args = fuzz_u8(&in);
  const uattn_status st =
      uattn_forward(args & 1 ? NULL : plan, args & 2 ? NULL : &L, args & 4 ? NULL : &t, args & 8 ? rt : NULL);
  if (st != UATTN_OK) {
    if (!uattn_last_error()[0]) fail("a refused forward gives no message");
    if (!fuzz_untouched(out.ptr, out.bytes) || !fuzz_untouched(lse.ptr, lse.bytes) ||
        !fuzz_untouched(kc.ptr, kc.bytes) || !fuzz_untouched(vc.ptr, vc.bytes))
      fail("a refused forward wrote to out, lse or a cache");
  }
  buffer all[] = {sinks, alibi, q, k, v, out, lse, kc, vc};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i].base);
  free(encoder_lens);
  free(cross_table);
  uattn_plan_destroy(plan);
  return 0;
}
