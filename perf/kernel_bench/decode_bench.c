/* uattn-kernel-bench's decode figures (--decode, --decode-layouts; usage in kernel_bench.c): the decode
 * kernels straight from the cache, hot, cold and against a plain read, in the forward's calls and in other
 * layouts; apart from kernel_bench.c because they time the decode path, not the attend and load the rest of
 * the tool compares. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/probe.h"
#include "common/timing.h"
#include "kernel_bench/kernel_bench.h"
#include "kernels.h"

/* ---- decode: the decode kernel straight from the cache ---------------------------------------------------- */

/* The blocks a decode call takes, as the forward hands them (runtime/attention/parts.c: unique_run): a list of as many as
 * make the set's decode_max_keys keys where the block size allows lists (uattn_decode_list_fits), else one. */
static int32_t decode_list_blocks(const uattn_kernels *set) {
  return uattn_decode_list_fits(set, block_keys) ? set->caps.decode_max_keys / block_keys : 1;
}

/* The last `rows` rows (<= 4, causal) of GQA 4 on every KV head of `keys` keys, as the forward hands them to
 * a decode kernel: their vectors (head after head), states, outputs and the kernel's scratch. */
typedef struct decode_rows {
  float *q, *m, *l, *o, *scratch;
  int32_t pos[4], vis[4];
  uattn_panel_job job;
} decode_rows;

static void decode_rows_init(decode_rows *d, int32_t rows, int32_t keys) {
  const size_t nx = (size_t)KV_HEADS * rows * GROUP;
  d->q = malloc(sizeof(float) * nx * head_dim), d->m = malloc(sizeof(float) * nx), d->l = malloc(sizeof(float) * nx);
  d->o = calloc(nx * head_dim, sizeof(float));
  d->scratch = aligned_alloc(64, sizeof(float) * uattn_decode_scratch_floats(KV_HEADS, rows * GROUP, head_dim));
  for (size_t i = 0; i < nx * head_dim; i++) d->q[i] = random_unit() / sqrtf((float)head_dim);
  for (size_t x = 0; x < nx; x++) d->m[x] = -INFINITY, d->l[x] = 0.0f;
  for (int32_t r = 0; r < rows; r++) d->pos[r] = keys - rows + r, d->vis[r] = d->pos[r] + 1;
  d->job = (uattn_panel_job){.rows = rows,
                             .group = GROUP,
                             .head_dim = head_dim,
                             .q = d->q,
                             .query_pos = d->pos,
                             .visible = d->vis,
                             .num_keys = keys,
                             .m = d->m,
                             .l = d->l,
                             .o = d->o,
                             .scale = 1.0f /* q holds the scale: for the sets that apply it to scores */};
}

static void decode_rows_free(decode_rows *d) { free(d->q), free(d->m), free(d->l), free(d->o), free(d->scratch); }

typedef struct decode_case {
  const uattn_kernels *set; /* NULL: a plain read of the blocks the kernel would read, no compute */
  const char *k, *v;        /* cache: [blocks][block_keys][KV_HEADS][head_dim] (NHD) or [blocks][KV_HEADS][..] */
  bool hnd;                 /* the blocks as HND: a call a KV head (the forward's units on an HND cache) */
  long blocks;              /* 1: the same block each call (hot) */
  int32_t list;             /* blocks a call (decode_list_blocks, or 1), the walk's next ones */
  uattn_panel_job job;      /* every KV head's vectors, head after head */
  float *scratch;
  float sink[8];
} decode_case;

/* A block's keys, then its values, read whole (bench_probe_read_words): the memory time of a call. Whole 128-byte lines
 * (a block's bytes are a multiple of 128 when the head dim is of 8, as decode needs). */
static void read_block(const char *k, const char *v, float *sink) {
  const size_t n = (size_t)block_keys * KV_HEADS * head_dim * uattn_dtype_size(cache_dtype) / 128 * 128;
  bench_probe_read_words(k, n, sink);
  bench_probe_read_words(v, n, sink);
}

/* The set's decode kernel over every KV head of the n blocks at k[], v[] as the forward calls it, each call
 * told where the next one reads (uattn_panel_job.next_k): on NHD one call (told the next call's first block,
 * next_k / next_v); on HND a call a head (runtime/attention/parts.c: decode_call), each told the next head's rows in the
 * first block, the last the next call's first head's. */
static void decode_call(const uattn_kernels *set, bool hnd, const uattn_panel_job *job, const char *const *k,
                        const char *const *v, int32_t n, const char *next_k, const char *next_v, float *scratch) {
  const size_t hv = (size_t)job->rows * GROUP;
  const void *kb[UATTN_DECODE_MAX_BLOCKS], *vb[UATTN_DECODE_MAX_BLOCKS];
  if (!hnd) {
    uattn_panel_job all = *job;
    all.next_k = next_k, all.next_v = next_v;
    for (int32_t i = 0; i < n; i++) kb[i] = k[i], vb[i] = v[i];
    const uattn_decode_src src = uattn_decode_blocks(set, kb, vb, n, block_keys, (size_t)KV_HEADS * head_dim, head_dim);
    set->decode(&all, KV_HEADS, hv, cache_dtype, &src, scratch);
    return;
  }
  const size_t head_keys = (size_t)block_keys * head_dim * uattn_dtype_size(cache_dtype);
  for (int32_t g = 0; g < KV_HEADS; g++) {
    uattn_panel_job h = uattn_decode_head_job(job, g, hv);
    const bool last = g + 1 == KV_HEADS;
    h.next_k = last ? next_k : k[0] + (g + 1) * head_keys, h.next_v = last ? next_v : v[0] + (g + 1) * head_keys;
    for (int32_t i = 0; i < n; i++) kb[i] = k[i] + g * head_keys, vb[i] = v[i] + g * head_keys;
    const uattn_decode_src src = uattn_decode_blocks(set, kb, vb, n, block_keys, (size_t)head_dim, 0);
    set->decode(&h, 1, hv, cache_dtype, &src, scratch);
  }
}

/* Call `call` of the walk: its list's blocks are the walk's blocks call * list to call * list + list - 1. */
static void run_decode(void *arg, long call) {
  decode_case *c = arg;
  const char *k[UATTN_DECODE_MAX_BLOCKS], *v[UATTN_DECODE_MAX_BLOCKS];
  for (int32_t i = 0; i < c->list; i++) {
    const size_t off = walk_offset(c->blocks, call * c->list + i);
    k[i] = c->k + off, v[i] = c->v + off;
    if (!c->set) read_block(k[i], v[i], c->sink);
  }
  const size_t next = walk_offset(c->blocks, (call + 1) * c->list);
  if (c->set) decode_call(c->set, c->hnd, &c->job, k, v, c->list, c->k + next, c->v + next, c->scratch);
}

/* --decode: the set's decode kernel over every KV head of the bucket's blocks, for 1, 2 and 4 rows of GQA 4,
 * in calls as the forward makes them (decode_list_blocks a call, scattered over the cache), on an NHD cache
 * (one call: the forward's all-heads unit) and on an HND one (a call a KV head, as the forward's units there):
 * hot (the same blocks each call), cold (a walk over a 256 MiB cache) and the plain read of the same walk;
 * where a call takes a list, also cold at one block a call (the kernel before lists). Cold against hot + read
 * says how much of the memory time the kernel hides behind its compute: 1.0 none, max(hot, read) / (hot +
 * read) all. With a variant (B; NULL: none) the set (A) and B, hot and cold, and B's speedup. */
int bench_decode(const uattn_kernels *set, const uattn_kernels *variant, const char *which, double peak) {
  if (!uattn_decode_fits(set, block_keys, head_dim, GROUP) || (variant && !variant->decode)) {
    fprintf(stderr, "uattn-kernel-bench: the %s set has no decode kernel for this shape\n",
            uattn_decode_fits(set, block_keys, head_dim, GROUP) ? variant->name : set->name);
    return 1;
  }
  const size_t block = (size_t)block_keys * KV_HEADS * head_dim;
  const int32_t list = decode_list_blocks(set);
  char *k = random_cache(block * cold_blocks), *v = random_cache(block * cold_blocks);
  printf("  the %s decode kernel%s\n  %d KV heads of %d-key %s blocks, %d a call; ns per key and KV head\n", which,
         variant ? " (A) against the variant's (B)" : ",", KV_HEADS, block_keys, uattn_dtype_name(cache_dtype), list);
  if (variant)
    printf("  %-34s %8s %8s %21s %8s %8s %21s\n", "", "hot A", "hot B", "speedup [quartiles]", "cold A", "cold B",
           "speedup [quartiles]");
  else
    printf("  %-34s %8s %6s %8s %8s %6s %9s %8s\n", "", "hot", "(peak)", "cold", "read", "(read)", "overlap", "cold 1");
  for (int hnd = 0; hnd < 2; hnd++)
    for (int32_t rows = 1; rows <= 4; rows *= 2) {
      decode_rows d, one;
      decode_rows_init(&d, rows, list * block_keys);
      decode_rows_init(&one, rows, block_keys);
      const uattn_panel_job job = d.job;
      float *scratch = d.scratch;
      const double kh = (double)list * block_keys * KV_HEADS, flops = 4.0 * head_dim * rows * GROUP * kh;
      char name[48];
      snprintf(name, sizeof name, "%s, %d row%s x %d heads (%2d vectors)", hnd ? "HND" : "NHD", rows,
               rows > 1 ? "s" : "", GROUP, rows * GROUP);
      if (variant) { /* A hot, B hot, A cold, B cold */
        decode_case c[4] = {{set, k, v, hnd, 1, list, job, scratch, {0}},
                            {variant, k, v, hnd, 1, list, job, scratch, {0}},
                            {set, k, v, hnd, cold_blocks, list, job, scratch, {0}},
                            {variant, k, v, hnd, cold_blocks, list, job, scratch, {0}}};
        double sec[4], raw[4][PERF_MAX_RUNS], hot[3], cold[3];
        time_interleaved(run_decode, 4, (void *const[4]){&c[0], &c[1], &c[2], &c[3]}, sec, raw);
        speedup_quartiles(raw[0], raw[1], hot), speedup_quartiles(raw[2], raw[3], cold);
        printf("  %-34s %8.1f %8.1f %6.3fx [%5.3f %5.3f] %8.1f %8.1f %6.3fx [%5.3f %5.3f]\n", name, sec[0] / kh * 1e9,
               sec[1] / kh * 1e9, hot[1], hot[0], hot[2], sec[2] / kh * 1e9, sec[3] / kh * 1e9, cold[1], cold[0],
               cold[2]);
      } else { /* hot, cold, read, and cold a block a call where the calls take lists */
        decode_case c[4] = {{set, k, v, hnd, 1, list, job, scratch, {0}},
                            {set, k, v, hnd, cold_blocks, list, job, scratch, {0}},
                            {NULL, k, v, hnd, cold_blocks, list, job, scratch, {0}},
                            {set, k, v, hnd, cold_blocks, 1, one.job, one.scratch, {0}}};
        double sec[4];
        time_interleaved(run_decode, list > 1 ? 4 : 3, (void *const[4]){&c[0], &c[1], &c[2], &c[3]}, sec, NULL);
        char cold1[16] = "-";
        if (list > 1) snprintf(cold1, sizeof cold1, "%.1f", sec[3] / ((double)block_keys * KV_HEADS) * 1e9);
        printf("  %-34s %8.1f %5.0f%% %8.1f %8.1f %5.0f%% %9.2f %8s\n", name, sec[0] / kh * 1e9,
               100 * flops / sec[0] * 1e-9 / peak, sec[1] / kh * 1e9, sec[2] / kh * 1e9, 100 * sec[2] / sec[1],
               sec[1] / (sec[0] + sec[2]), cold1);
      }
      decode_rows_free(&d), decode_rows_free(&one);
    }
  if (variant)
    printf(
        "\n  speedup: B's, the median of the runs' (A's time over B's; above 1: B is faster), and their quartiles\n");
  else
    printf(
        "\n  (peak): hot against the FMA peak; (read): the plain read's time over cold's, the share of the\n"
        "  bandwidth the kernel reaches; overlap: cold / (hot + read); cold 1: cold at one block a call\n");
  free_cache(k, block * cold_blocks), free_cache(v, block * cold_blocks);
  return 0;
}

/* The cache layouts --decode-layouts walks: the block's keys and values are 2 x block_keys x KV_HEADS x
 * head_dim elements at kv + the block's offset, arranged as */
typedef enum block_layout {
  LAYOUT_NHD,      /* keys [key][head][dim], then values so: the forward's all-heads unit, one call a block */
  LAYOUT_HND,      /* keys [head][key][dim], then values so: the forward's units of one head, a call each */
  LAYOUT_HEAD_KV,  /* [head][keys, then values][key][dim]: the block one ascending stream, a call a head */
  LAYOUT_TILED,    /* uattn's own (UATTN_LAYOUT_TILED): keys, then values, in 16-key tiles of every head in
                   * turn, the set's decode_tiled, one call a block */
  LAYOUT_TILED_KV, /* not a layout of uattn's: TILED with each head's values of a tile right after its keys, so
                    * that the walk (of bf16; fp8's shares are two tiles) is one ascending stream (uattn-experiments overlap) */
  LAYOUT_READ,     /* no kernel: a plain read of the block's bytes, in address order */
} block_layout;

typedef struct layout_case {
  const uattn_kernels *set;
  block_layout layout;
  const char *kv; /* the cache: cold_blocks blocks of keys and values */
  long blocks;    /* 1: the same block each call (hot) */
  uattn_panel_job job;
  float *scratch;
  float sink[8];
} layout_case;

static void run_layout(void *arg, long call) {
  layout_case *c = arg;
  const size_t esz = uattn_dtype_size(cache_dtype), half = (size_t)block_keys * KV_HEADS * head_dim * esz;
  const char *k = c->kv + 2 * walk_offset(c->blocks, call), *v = k + half;
  const char *next = c->kv + 2 * walk_offset(c->blocks, call + 1); /* the next call's block */
  const size_t hv = (size_t)c->job.rows * GROUP;
  switch (c->layout) {
  case LAYOUT_NHD:
  case LAYOUT_HND: /* one block a call: the layouts' walks compare the same calls */
    decode_call(c->set, c->layout == LAYOUT_HND, &c->job, &k, &v, 1, next, next + half, c->scratch);
    return;
  case LAYOUT_TILED: { /* told the next call's block, as the forward tells it */
    uattn_panel_job job = c->job;
    job.next_k = next, job.next_v = next + half;
    c->set->decode_tiled(&job, KV_HEADS, hv, cache_dtype, k, v, (size_t)KV_HEADS * UATTN_TILED_KEYS * head_dim,
                         (size_t)UATTN_TILED_KEYS * head_dim, c->scratch);
    return;
  }
  case LAYOUT_TILED_KV: { /* the strides of both caches doubled, the values a head's share after the keys */
    uattn_panel_job job = c->job;
    const size_t share = (size_t)UATTN_TILED_KEYS * head_dim * esz;
    job.next_k = next, job.next_v = next + share;
    c->set->decode_tiled(&job, KV_HEADS, hv, cache_dtype, k, k + share,
                         2 * (size_t)KV_HEADS * UATTN_TILED_KEYS * head_dim, 2 * (size_t)UATTN_TILED_KEYS * head_dim,
                         c->scratch);
    return;
  }
  case LAYOUT_READ: read_block(k, v, c->sink); return;
  case LAYOUT_HEAD_KV: { /* no hints: the layout is one ascending stream */
    const size_t head_keys = (size_t)block_keys * head_dim * esz;
    for (int32_t g = 0; g < KV_HEADS; g++) {
      const uattn_panel_job h = uattn_decode_head_job(&c->job, g, hv);
      const void *kb = k + 2 * g * head_keys, *vb = k + (2 * g + 1) * head_keys;
      const uattn_decode_src src = uattn_decode_one_block(&kb, &vb, (size_t)head_dim, 0);
      c->set->decode(&h, 1, hv, cache_dtype, &src, c->scratch);
    }
    return;
  }
  }
}

/* --decode-layouts: what a cache layout buys the decode kernel's walk over memory (DESIGN: a layout of
 * uattn's own is allowed where it pays). The same kernel on the same 512 MiB of blocks (keys and values
 * adjacent) in three layouts, cold, and the set's decode_tiled (where it has one) on them as a TILED cache,
 * hot and cold, and cold as TILED K|V, against a plain read of the blocks and the kernel hot, for 1 and 2 rows
 * of GQA 4, in ns per key and KV head. With a variant (NULL: none) its decode_tiled too, hot and cold, in the
 * same rounds. */
int bench_decode_layouts(const uattn_kernels *set, const uattn_kernels *variant, const char *which) {
  if (!uattn_decode_fits(set, block_keys, head_dim, GROUP)) {
    fprintf(stderr, "uattn-kernel-bench: the %s set has no decode kernel for this shape\n", set->name);
    return 1;
  }
  const size_t block = (size_t)block_keys * KV_HEADS * head_dim;
  char *kv = random_cache(2 * block * cold_blocks);
  printf(
      "  the %s decode kernel; %d-key %s blocks, keys and values adjacent, a walk over %ld MiB;\n"
      "  ns per key and KV head\n",
      which, block_keys, uattn_dtype_name(cache_dtype),
      (long)(2 * block * cold_blocks * uattn_dtype_size(cache_dtype) >> 20));
  const bool tiled = block_keys % UATTN_TILED_KEYS == 0 &&
                     uattn_decode_tiled_fits(set, block_keys, head_dim, GROUP, cache_dtype, false);
  const bool vt = tiled && variant && variant->decode_tiled; /* the variant's decode_tiled beside the set's */
  printf("  %-28s %8s %8s %8s %10s %8s %8s %9s %8s%s\n", "", "hot", "hot T", "NHD", "HND", "head K|V", "TILED",
         "TILED K|V", "read", vt ? "  hot T B  TILED B" : "");
  for (int32_t rows = 1; rows <= 2; rows++) {
    decode_rows d;
    decode_rows_init(&d, rows, block_keys);
    layout_case c[PERF_MAX_CASES] = {{set, LAYOUT_NHD, kv, 1, d.job, d.scratch, {0}},
                                     {set, LAYOUT_NHD, kv, cold_blocks, d.job, d.scratch, {0}},
                                     {set, LAYOUT_HND, kv, cold_blocks, d.job, d.scratch, {0}},
                                     {set, LAYOUT_HEAD_KV, kv, cold_blocks, d.job, d.scratch, {0}},
                                     {set, LAYOUT_READ, kv, cold_blocks, d.job, d.scratch, {0}},
                                     {set, LAYOUT_TILED, kv, 1, d.job, d.scratch, {0}},
                                     {set, LAYOUT_TILED, kv, cold_blocks, d.job, d.scratch, {0}},
                                     {set, LAYOUT_TILED_KV, kv, cold_blocks, d.job, d.scratch, {0}},
                                     {variant, LAYOUT_TILED, kv, 1, d.job, d.scratch, {0}},
                                     {variant, LAYOUT_TILED, kv, cold_blocks, d.job, d.scratch, {0}}};
    double sec[PERF_MAX_CASES];
    const int n = vt ? 10 : tiled ? 8 : 5;
    time_interleaved(run_layout, n,
                     (void *const[10]){&c[0], &c[1], &c[2], &c[3], &c[4], &c[5], &c[6], &c[7], &c[8], &c[9]}, sec,
                     NULL);
    const double kh = (double)block_keys * KV_HEADS;
    char name[48], hot_t[16] = "-", cold_t[16] = "-", kv_t[16] = "-";
    snprintf(name, sizeof name, "%d row%s x %d heads (%d vectors)", rows, rows > 1 ? "s" : "", GROUP, rows * GROUP);
    if (tiled)
      snprintf(hot_t, sizeof hot_t, "%.1f", sec[5] / kh * 1e9),
          snprintf(cold_t, sizeof cold_t, "%.1f", sec[6] / kh * 1e9),
          snprintf(kv_t, sizeof kv_t, "%.1f", sec[7] / kh * 1e9);
    printf("  %-28s %8.1f %8s %8.1f %10.1f %8.1f %8s %9s %8.1f", name, sec[0] / kh * 1e9, hot_t, sec[1] / kh * 1e9,
           sec[2] / kh * 1e9, sec[3] / kh * 1e9, cold_t, kv_t, sec[4] / kh * 1e9);
    if (vt) printf(" %9.1f %8.1f", sec[8] / kh * 1e9, sec[9] / kh * 1e9);
    printf("\n");
    decode_rows_free(&d);
  }
  printf(
      "\n  hot: NHD, one block again and again; hot T: the same with decode_tiled (- : the set has none for\n"
      "  this shape); NHD, HND, head K|V, TILED: the cold walk in each layout; TILED K|V: decode_tiled on\n"
      "  TILED blocks whose heads' values of a tile follow their keys (one stream; not a layout of uattn's)%s\n",
      vt ? ";\n  hot T B, TILED B: the variant's decode_tiled (--variant), hot and cold" : "");
  free_cache(kv, 2 * block * cold_blocks);
  return 0;
}
