/* A kernel set: how one implementation loads key/value panels and attends rows to them. The forward picks
 * one set per call (a generated bucket's, else the best generic set the CPU runs, or the one UATTN_ISA
 * forces) and uses nothing else, so each set is free to choose its own panel layout. */
#ifndef UATTN_KERNELS_H
#define UATTN_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "convert.h"
#include "state.h"
#include "uattn.h"

/* A block of query rows, each with all the query heads of one KV head, against one panel of keys: the unit
 * every kernel implements, so its shape is what matters: the group's heads share each key load, and rows
 * differ only in how many keys they see. */
typedef struct uattn_panel_job {
  int32_t rows, group, head_dim;
  const float *q;             /* [rows][group][head_dim], multiplied by the scale unless the set takes
                             * unscaled queries (uattn_kernel_caps.unscaled_q) */
  const int32_t *query_pos;   /* [rows] positions of the rows */
  const int32_t *visible;     /* [rows] row i may see keys [0, visible[i]) (the window applies on top) */
  int32_t num_keys, key_pos0; /* key i of the panel is at position key_pos0 + i */
  const float *keys, *values; /* [num_keys][head_dim] */
  float soft_cap;             /* > 0: cap * tanh(s / cap) */
  int32_t window;             /* > 0: keys at or before query position - window are not seen */
  const float *alibi;         /* [group] slopes of the group's heads, or NULL */
  float *m, *l;               /* [rows][group] running max and sum */
  float *o;                   /* [rows][group][head_dim] unnormalized output */
  float *scores;              /* scratch, [num_keys] */
  float scale;                /* the layer's score scale, for the sets that take unscaled queries
                               * (uattn_kernel_caps.unscaled_q) */
  bool probs_fp32;            /* the layer's probs_fp32 (uattn.h): only bf16 sets read it */
  const void *next_k;         /* decode, decode_tiled: the next call's first key row (decode: its first block's, head
                               * 0's; NULL: none, or not known), whose first keys a kernel may ask for as it ends */
  const void *next_v;         /* decode, decode_tiled: the next call's first value row, the same for its first values */
  int32_t value_dim;          /* the dims of o the caller keeps (0: head_dim): P V must compute o's first value_dim
                               * dims and may skip the rest (o's stride stays head_dim), whose values are then
                               * unspecified. The forward passes the layer's head_dim_v: an MLA layer's values
                               * are shorter than its keys, and out keeps only their dims */
} uattn_panel_job;

/* The dims of o a job's P V must compute (uattn_panel_job.value_dim). */
static inline int32_t uattn_job_value_dim(const uattn_panel_job *job) {
  return job->value_dim > 0 ? job->value_dim : job->head_dim;
}

/* Where a decode call's keys and values lie: its cache blocks in the order of their keys, block_keys keys each
 * (the last may hold fewer): key i of head g at k[i / block_keys] + (i % block_keys) * stride + g * head_stride
 * elements of the cache's dtype, value i the same from v. One block (block_keys a power of two, at least the
 * call's keys), or several (uattn_decode_list_fits: block_keys a power of two and a multiple of the
 * set's decode tile, so that no P V tile straddles two blocks): a decode call's fixed cost
 * (its query vectors and outputs put in its order, each vector's softmax steps) paid once for up to
 * UATTN_DECODE_MAX_KEYS keys of a request's blocks wherever they lie, and the next block's rows asked for
 * as the walk nears them. */
typedef struct uattn_decode_src {
  const void *const *k, *const *v;
  int32_t block_keys;
  size_t stride, head_stride;
} uattn_decode_src;

/* What a set takes: stated once per ISA, as <ISA>_CAPS in the ISA's header (the values of the fields below, in
 * their order), from which both the set's record (UATTN_CAPS_RECORD) and the generated buckets' preprocessor
 * conditions (bucket_entry.h: UATTN_CAPS_DECODE_DIM and its kin) are made; dispatch, the forward, the report
 * and the tests read the record through the predicates below. */
typedef struct uattn_kernel_caps {
  /* Whether the set's attend takes the queries unscaled (job->q as widened) and multiplies each fp32 score by
   * job->scale itself; otherwise job->q is already multiplied by the layer's scale. The bf16 sets do: they round
   * the query to bf16, and rounding the model's own bf16 query is exact where rounding a scaled copy of it is not.
   * decode_unscaled_q: the same for its decode and decode_tiled, which may be another ISA's (avx512bf16fma). */
  bool unscaled_q, decode_unscaled_q;
  /* Whether the set rounds the query, keys and values to bf16 (bf16 dot products): it keeps a layer's precision
   * only for bf16 queries on bf16 or fp8 caches (every fp8 value is exact in bf16), and the dispatch gives it
   * no other layer (uattn_kernels_keep_precision). */
  bool bf16_inputs;
  /* decode (where the set has one): head dims a multiple of decode_dim_multiple, up to decode_max_keys keys and
   * decode_max_vectors query vectors a head a call (within UATTN_DECODE_MAX_KEYS and _VECTORS); its P V walks
   * decode_tile keys at a time, so a list's blocks hold whole tiles (uattn_decode_list_fits). */
  int32_t decode_dim_multiple, decode_max_keys, decode_max_vectors, decode_tile;
  /* load_tiled and decode_tiled (where the set has them): the cache dtypes they read as they lie (a mask of
   * UATTN_DTYPE_BIT), and decode_tiled's head dims, a multiple of tiled_dim_multiple; tiled_probs_fp32: whether
   * decode_tiled keeps P in fp32 for a layer's probs_fp32 (else such a layer's rows are gathered for decode). */
  uint32_t tiled_cache_dtypes;
  int32_t tiled_dim_multiple;
  bool tiled_probs_fp32;
} uattn_kernel_caps;

#define UATTN_DTYPE_BIT(t) (1u << (t))

/* The record and the preprocessor's view of an ISA's <ISA>_CAPS list (the fields of uattn_kernel_caps in order). */
#define UATTN_CAPS_APPLY_(macro, ...) macro(__VA_ARGS__)
#define UATTN_CAPS_RECORD_(uq, du, bi, dd, dk, dv, dt, tc, td, tp)                                                     \
  {                                                                                                                    \
    .unscaled_q = (uq), .decode_unscaled_q = (du), .bf16_inputs = (bi), .decode_dim_multiple = (dd),                   \
    .decode_max_keys = (dk), .decode_max_vectors = (dv), .decode_tile = (dt), .tiled_cache_dtypes = (tc),              \
    .tiled_dim_multiple = (td), .tiled_probs_fp32 = (tp)                                                               \
  }
#define UATTN_CAPS_RECORD(caps) UATTN_CAPS_APPLY_(UATTN_CAPS_RECORD_, caps)
#define UATTN_CAPS_DECODE_DIM_(uq, du, bi, dd, ...) dd
#define UATTN_CAPS_DECODE_DIM(caps) UATTN_CAPS_APPLY_(UATTN_CAPS_DECODE_DIM_, caps)
#define UATTN_CAPS_DECODE_KEYS_(uq, du, bi, dd, dk, ...) dk
#define UATTN_CAPS_DECODE_KEYS(caps) UATTN_CAPS_APPLY_(UATTN_CAPS_DECODE_KEYS_, caps)
#define UATTN_CAPS_TILED_DIM_(uq, du, bi, dd, dk, dv, dt, tc, td, ...) td
#define UATTN_CAPS_TILED_DIM(caps) UATTN_CAPS_APPLY_(UATTN_CAPS_TILED_DIM_, caps)

typedef struct uattn_kernels {
  const char *name; /* e.g. "portable", "avx2" */
  /* Widens count keys and values (rows k_src + i * stride and v_src + i * stride, elements of dtype, each
   * head_dim long) into the panels, in this set's layout for a panel of panel_keys keys. */
  void (*load)(uattn_dtype dtype, const void *k_src, const void *v_src, size_t stride, int32_t count, int32_t head_dim,
               int32_t panel_keys, float *keys, float *values);
  /* Optional (NULL: the forward gathers a TILED cache's blocks into rows for load): load's panels from keys
   * [first, first + count) of a block of a UATTN_LAYOUT_TILED cache, one KV head, where uattn_load_tiled_fits
   * says so. k_src / v_src: the head's share of the block's first tile; stride: elements from a tile's share
   * to the next tile's. */
  void (*load_tiled)(uattn_dtype dtype, const void *k_src, const void *v_src, size_t stride, int32_t first,
                     int32_t count, int32_t head_dim, int32_t panel_keys, float *keys, float *values);
  /* uattn_panel_job semantics, with job->keys/values as load produced them (num_keys <= panel_keys), one
   * entry per part of the attention (uattn_part): a generic set has the same function thrice, a bucket its
   * own specialized and separately named ones, so a profile says which part and which bucket ran. The
   * unique part's jobs have one row. */
  void (*attend[UATTN_NUM_PARTS])(const uattn_panel_job *job, int32_t panel_keys);
  /* Floats each panel needs for panel_keys keys (a set may pad). */
  size_t (*panel_floats)(int32_t panel_keys, int32_t head_dim);
  /* Optional (NULL: load, then attend): jobs of a few rows (decodes, short verifications) straight from
   * the cache, without panels (job->keys, values and scores unused), for `heads` KV heads at once: head g's
   * keys and values where src says (uattn_decode_src), elements of dtype, its query vectors and states
   * head_vectors vectors after head g - 1's (q and o + g * head_vectors * head_dim, m and l + g *
   * head_vectors), its slopes at alibi + g * group; every head's rows see the same keys. Each head's result
   * is the one a call for that head alone gives, bit for bit. scratch: uattn_decode_scratch_floats floats,
   * 32-byte aligned. Only within the set's decode limits (uattn_decode_fits). */
  void (*decode)(const uattn_panel_job *job, int32_t heads, size_t head_vectors, uattn_dtype dtype,
                 const uattn_decode_src *src, float *scratch);
  /* Optional (NULL: the forward gathers a TILED cache's blocks into rows for decode): decode's job on a
   * UATTN_LAYOUT_TILED cache, where uattn_decode_tiled_fits says so. k_src / v_src: the block's first tile,
   * the first head's share of it; stride: elements from a tile to the next; head_stride: from a head's share
   * of a tile to the next head's. */
  void (*decode_tiled)(const uattn_panel_job *job, int32_t heads, size_t head_vectors, uattn_dtype dtype,
                       const void *k_src, const void *v_src, size_t stride, size_t head_stride, float *scratch);
  uattn_kernel_caps caps; /* what it takes (uattn_kernel_caps) */
} uattn_kernels;

/* Whether a set computes a layer of these dtypes at the layer's own precision (uattn_kernel_caps.bf16_inputs). */
static inline bool uattn_kernels_keep_precision(const uattn_kernels *k, uattn_dtype dtype, uattn_dtype cache_dtype) {
  return !k->caps.bf16_inputs ||
         (dtype == UATTN_BF16 && (cache_dtype == UATTN_BF16 || uattn_dtype_is_fp8(cache_dtype)));
}

/* A decode call's bounds, the most a set's record may state (scratch and block arrays are sized by them): every
 * set's decode tile is a multiple of UATTN_DECODE_MIN_TILE (the P V step of the decode walk the ISAs share), so a
 * call's list has at most UATTN_DECODE_MAX_BLOCKS blocks. */
#define UATTN_DECODE_MAX_KEYS 256 /* a power of two: a one-block call's block_keys (uattn_decode_one_block) */
#define UATTN_DECODE_MAX_VECTORS 16
#define UATTN_DECODE_MIN_TILE 8
#define UATTN_DECODE_MAX_BLOCKS (UATTN_DECODE_MAX_KEYS / UATTN_DECODE_MIN_TILE)
#define UATTN_CAPS_CHECK_(uq, du, bi, dd, dk, dv, dt, ...)                                                             \
  _Static_assert(                                                                                                      \
      (dk) <= UATTN_DECODE_MAX_KEYS && (dv) <= UATTN_DECODE_MAX_VECTORS && (dt) % UATTN_DECODE_MIN_TILE == 0,          \
      "a set's decode limits lie beyond a decode call's bounds")
/* Holds an ISA's <ISA>_CAPS to the bounds above. */
#define UATTN_CAPS_CHECK(caps) UATTN_CAPS_APPLY_(UATTN_CAPS_CHECK_, caps)
/* Keys of a tile of the TILED layout (uattn.h): a 64-byte line holds a dim pair of this many bf16 keys. */
#define UATTN_TILED_KEYS 16

/* Head g's job within a decode job of several heads (decode's arguments above: head g's query vectors, outputs,
 * states and slopes follow head g - 1's, head_vectors vectors and group slopes on). */
static inline uattn_panel_job uattn_decode_head_job(const uattn_panel_job *job, int32_t g, size_t head_vectors) {
  uattn_panel_job h = *job;
  h.q += (size_t)g * head_vectors * (size_t)job->head_dim, h.o += (size_t)g * head_vectors * (size_t)job->head_dim;
  h.m += (size_t)g * head_vectors, h.l += (size_t)g * head_vectors;
  if (h.alibi) h.alibi += (size_t)g * (size_t)job->group;
  return h;
}

/* Scratch floats a decode call of `heads` heads of `vectors` query vectors each needs (the vectors in the
 * kernel's order, their scores). */
static inline size_t uattn_decode_scratch_floats(int32_t heads, int32_t vectors, int32_t head_dim) {
  return (size_t)heads * (size_t)vectors * ((size_t)head_dim + UATTN_DECODE_MAX_KEYS);
}

/* Whether a set's decode kernel takes a layer's cache blocks, for a decode row of `group` query heads (every
 * cache dtype: the decode kernels widen each, fp8 included). */
static inline bool uattn_decode_fits(const uattn_kernels *k, int32_t block_size, int32_t head_dim, int32_t group) {
  return k->decode && block_size <= k->caps.decode_max_keys && head_dim % k->caps.decode_dim_multiple == 0 &&
         group <= k->caps.decode_max_vectors;
}

/* Whether a set's decode call may take several blocks of block_size keys (uattn_decode_src). */
static inline bool uattn_decode_list_fits(const uattn_kernels *k, int32_t block_size) {
  return k->caps.decode_tile > 0 && block_size % k->caps.decode_tile == 0 && (block_size & (block_size - 1)) == 0;
}

/* A decode call's source of one block (uattn_decode_src): k[0] and v[0] the call's first rows. */
static inline uattn_decode_src uattn_decode_one_block(const void *const *k, const void *const *v, size_t stride,
                                                      size_t head_stride) {
  return (uattn_decode_src){k, v, UATTN_DECODE_MAX_KEYS, stride, head_stride};
}

/* A decode call's source over `count` blocks of block_keys keys whose first rows are (to be) in k[] and v[]: a
 * list where there are several and the block size allows one (uattn_decode_list_fits), else one block from
 * k[0] (a run of adjacent blocks, whose rows are one stretch, counts as one). */
static inline uattn_decode_src uattn_decode_blocks(const uattn_kernels *set, const void *const *k, const void *const *v,
                                                   int32_t count, int32_t block_keys, size_t stride,
                                                   size_t head_stride) {
  return count == 1 || !uattn_decode_list_fits(set, block_keys)
             ? uattn_decode_one_block(k, v, stride, head_stride)
             : (uattn_decode_src){k, v, block_keys, stride, head_stride};
}

/* Whether a set's decode_tiled takes a layer's TILED cache blocks (uattn_kernel_caps: the decode kernel's limits
 * and the tiled ones). */
static inline bool uattn_decode_tiled_fits(const uattn_kernels *k, int32_t block_size, int32_t head_dim, int32_t group,
                                           uattn_dtype cache_dtype, bool probs_fp32) {
  return k->decode_tiled && uattn_decode_fits(k, block_size, head_dim, group) &&
         head_dim % k->caps.tiled_dim_multiple == 0 && (!probs_fp32 || k->caps.tiled_probs_fp32) &&
         (k->caps.tiled_cache_dtypes & UATTN_DTYPE_BIT(cache_dtype));
}

/* Whether a set's load_tiled takes a TILED cache of this dtype (uattn_kernel_caps.tiled_cache_dtypes). */
static inline bool uattn_load_tiled_fits(const uattn_kernels *k, uattn_dtype cache_dtype) {
  return k->load_tiled && (k->caps.tiled_cache_dtypes & UATTN_DTYPE_BIT(cache_dtype));
}

/* The generic set for this CPU: the best one it runs, unless $UATTN_ISA names a rung of the ladder
 * (uattn_isa_registry: "amx", "avx512bf16fma", "avx512bf16", ...), the highest level to use: then the best set at
 * or below it that this CPU runs, or, where $UATTN_TWINS is set (the test suites set it) and the CPU lacks the
 * named level, that level's exact twin, so every level's logic runs on every CPU. A name that is no rung
 * falls back to the best set. *why (NULL when not asked) says how it was chosen; *forced (when not NULL) whether
 * UATTN_ISA chose it. */
const uattn_kernels *uattn_kernels_select(const char **why, bool *forced);

/* A generated bucket: kernels specialized at build time for one (block_size, head_dim, cache dtype,
 * chunk_size) by gen/generate.py, for one ISA. */
typedef struct uattn_bucket_kernels {
  int32_t block_size, head_dim;
  uattn_dtype dtype; /* of the cache */
  int32_t chunk_size;
  const char *isa;                         /* the generic set it specializes ("avx2", "avx512", "avx512bf16") */
  int (*runs_here)(void);                  /* whether this CPU runs it */
  const char *part_names[UATTN_NUM_PARTS]; /* its attend functions' names, e.g. uattn_bf16_unique_b128_d128_c0__avx2 */
  const char *decode_tiled_name;           /* its decode_tiled's name, NULL without one */
  uattn_kernels set;
} uattn_bucket_kernels;

/* The registry the generator writes (build/gen/registry.c): every generated bucket, best ISA first. */
extern const uattn_bucket_kernels *const uattn_bucket_registry[];
extern const size_t uattn_bucket_registry_size;

/* One rung of the ISA ladder (gen/manifest.json): a generic set and the probe that says whether this CPU runs it. */
typedef struct uattn_isa {
  const char *name;            /* the set's name, which UATTN_ISA and uattn_bucket_kernels.isa use */
  const uattn_kernels *set;    /* its generic kernels */
  int (*runs_here)(void);      /* NULL: runs everywhere (the portable set, the last rung) */
  const char *shares;          /* the ISA whose bucket load and attend functions its buckets use, or NULL */
  const char *decodes;         /* the ISA whose bucket decode kernels its buckets use, or NULL */
  const uattn_kernels *twin;   /* its exact twin for CPUs without it (tests only: uattn_kernels_select), or NULL */
  int (*twin_runs_here)(void); /* whether this CPU runs the twin */
} uattn_isa;

/* The ladder the generator writes (build/gen/registry.c), best first, the portable set last. */
extern const uattn_isa uattn_isa_registry[];
extern const size_t uattn_isa_registry_size;

/* The kernels for a layer's shape, and why: the bucket of (block_size, head_dim, cache dtype, chunk_size)
 * when one was generated for an ISA this CPU runs (and UATTN_ISA forces no generic set), else the generic
 * set of uattn_kernels_select. dtype (the layer's queries, keys and values) matters to the levels that round
 * their inputs to bf16 (uattn_kernels_keep_precision): a layer they would lower precision of goes to the next
 * level down, also where UATTN_ISA names them.
 * *bucket is the bucket used (NULL for a generic set); why (>= 160 bytes) says which and why in words. */
const uattn_kernels *uattn_kernels_dispatch(int32_t block_size, int32_t head_dim, uattn_dtype cache_dtype,
                                            uattn_dtype dtype, int32_t chunk_size, const uattn_bucket_kernels **bucket,
                                            char *why, size_t why_size);

#endif
