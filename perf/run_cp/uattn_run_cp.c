/* uattn-run-cp: the step runner over MPI with context parallelism. Every rank reads the same
 * STEP.json (support/step.c), keeps its share of every request's KV cache (position p on rank (p / I) % N at
 * local position (p / (I * N)) * I + p % I) in a cache of its own with its own block tables, plans and runs
 * its share (uattn_plan_config's cp_size / cp_rank / cp_interleave), and sends its partial output, in fp32
 * whatever the step's dtype (uattn_tensors.out_f32), and lse to rank 0 (MPI_Gather, rank order), which merges
 * them in fp32 (uattn_merge_states), rounds the result once to the step's dtype, as uattn-run's forward
 * rounds its own, and writes what uattn-run writes, in the global layout: the same checker serves both.
 *
 * Errors: a rank that fails records one line; before every collective that could block, the ranks agree on
 * whether any failed (agree(): an MPI_Allreduce), and then all print the first failing rank's line and exit
 * 2, so no rank waits in a collective for a rank that has given up. */
#include <limits.h>
#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/args.h"
#include "common/timing.h"
#include "convert.h"
#include "run/runner.h"
#include "uattn.h"
#include "uattn_vllm.h"

#define EXIT_BAD 2

static const char usage_text[] =
    "usage: mpirun -np N uattn-run-cp STEP.json --out DIR [--interleave I] [--threads T] [--repeat R]\n"
    "\n"
    "Runs one attention step dumped from an engine (uattn-run's STEP.json) with its KV cache spread over the N\n"
    "ranks of MPI_COMM_WORLD: position p of a request lives on rank (p / I) % N. Each rank plans and runs its\n"
    "share; rank 0 gathers the partial outputs and lse, merges them and writes to DIR what uattn-run writes:\n"
    "  out.npy, lse.npy, key_cache.npy and value_cache.npy (after this step's update, in the global layout;\n"
    "  a kv_latent step has no value cache), plan.json (the planner's metadata of the whole step)\n"
    "\n"
    "  --out DIR        where rank 0 writes (created if missing)\n"
    "  --interleave I   positions dealt to a rank in a row (default 1)\n"
    "  --threads T      workers of each rank's runtime (default: the step's \"threads\", else one per core\n"
    "                   of the rank's binding)\n"
    "  --repeat R       then time R more steps (plan, forward, gather, merge); rank 0 writes timing.json:\n"
    "                   median ms per step, the slowest rank's plan + forward (wall and CPU time), bytes\n"
    "                   gathered per rank (fp32 partials and lse), KV bytes per rank\n"
    "  -h, --help       this text\n"
    "\n"
    "Exit status: 0, or 2 on every rank with the same line on stderr naming the key, file or option at fault.\n";

/* ---- errors ------------------------------------------------------------------------------------------ */

static int my_rank, num_ranks;

/* Collective: 0 when no rank failed (rc 0 everywhere); else -1 on every rank, with the lowest failing rank's
 * line in runner_error, so all ranks report the same thing. */
static int agree(int rc) {
  int mine = rc ? my_rank : num_ranks, first;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (first == num_ranks) return 0;
  MPI_Bcast(runner_error, (int)sizeof runner_error, MPI_CHAR, first, MPI_COMM_WORLD);
  return -1;
}

/* ---- the run ------------------------------------------------------------------------------------------ */

typedef struct cp_run {
  runner_options o; /* STEP.json, --out, --repeat */
  int32_t interleave, threads;

  step s;             /* STEP.json and its tensors, the global caches (step.h) */
  uattn_plan *whole;  /* the whole step, planned as uattn-run plans it: validation, plan.json, slots */
  int32_t *local_len; /* [num_reqs] positions of each request on this rank */
  int32_t num_local_blocks, local_stride;
  int32_t *local_table; /* [num_reqs, local_stride], -1 padded */
  int64_t *local_slots; /* [num_local_blocks * block_size]: the global slot each local slot holds, or -1 */
  size_t local_key_bytes, local_value_bytes;
  void *key_cache, *value_cache; /* this rank's share (no value cache for a kv_latent step) */
  float *out;                    /* the partial output [T, Hq, Dv] in fp32 (out_f32) */
  float *lse;                    /* [T, Hq] */
  uattn_plan *plan;              /* this rank's share of the step */
  uattn_runtime *rt;
} cp_run;

static void run_free(cp_run *r) {
  step_free(&r->s);
  uattn_plan_destroy(r->whole);
  uattn_plan_destroy(r->plan);
  uattn_runtime_destroy(r->rt);
  free(r->local_len);
  free(r->local_table);
  free(r->local_slots);
  uattn_cache_free(r->key_cache, r->local_key_bytes);
  uattn_cache_free(r->value_cache, r->local_value_bytes);
  free(r->out);
  free(r->lse);
}

/* The length of a key's (value false) or a value's (true) row: head_dim or head_dim_v. */
static int32_t row_dims(const step *s, bool value) { return value ? s->head_dim_v : s->head_dim; }

/* Element (slot, KV head h, dim d) of the step's key cache (value false) or value cache (value true), as
 * uattn.h lays them out, D the cache's row length (row_dims): NHD [slots, Hkv, D] and HND
 * [blocks, Hkv, block_size, D] both caches alike; TILED keys [blocks, block_size / 16, Hkv, D / 2, 16, 2],
 * values [blocks, block_size / 16, Hkv, 8, D, 2]. */
static size_t cache_index(const step *s, bool value, int64_t slot, int32_t h, int32_t d) {
  const size_t hkv = (size_t)s->hkv, D = (size_t)row_dims(s, value), bs = (size_t)s->block_size;
  const size_t b = (size_t)slot / bs, o = (size_t)slot % bs, hh = (size_t)h, dd = (size_t)d;
  if (s->layout == UATTN_LAYOUT_NHD) return ((size_t)slot * hkv + hh) * D + dd;
  if (s->layout == UATTN_LAYOUT_HND) return ((b * hkv + hh) * bs + o) * D + dd;
  const size_t tile = (b * (bs / 16) + o / 16) * hkv + hh, i = o % 16;
  return value ? ((tile * 8 + i / 2) * D + dd) * 2 + i % 2 : ((tile * (D / 2) + dd / 2) * 16 + i) * 2 + dd % 2;
}

/* Where dim d of (slot, KV head h) is: in the cache, or for a slot of -1 in a packed [head_dim] row. */
static size_t head_index(const step *s, bool value, int64_t slot, int32_t h, int32_t d) {
  return slot < 0 ? (size_t)d : cache_index(s, value, slot, h, d);
}

/* Copies the row_dims elements of KV head h between two caches of the step's layout or a cache and a packed
 * row (slot -1). NHD and HND hold a slot's head contiguously; TILED strides it (a key's dim pairs 32
 * elements apart, a value's dims 2 apart), so it goes an element at a time. */
static void copy_head(const step *s, bool value, void *dst, int64_t dst_slot, const void *src, int64_t src_slot,
                      int32_t h) {
  const size_t es = uattn_dtype_size(s->cache_dtype);
  const int32_t dims = row_dims(s, value);
  const int32_t n = s->layout == UATTN_LAYOUT_TILED ? dims : 1;
  const size_t run = s->layout == UATTN_LAYOUT_TILED ? es : (size_t)dims * es;
  for (int32_t d = 0; d < n; d++)
    memcpy((char *)dst + head_index(s, value, dst_slot, h, d) * es,
           (const char *)src + head_index(s, value, src_slot, h, d) * es, run);
}

/* A slot's keys (value false) or values (true), every KV head; 0 for a kv_latent step's values. */
static size_t cache_row_bytes(const step *s, bool value) {
  if (value && s->kv_latent) return 0;
  return (size_t)s->hkv * (size_t)row_dims(s, value) * uattn_dtype_size(s->cache_dtype);
}

/* Copies one slot's K or V (every KV head) between caches of the step's layout. */
static void copy_slot(const step *s, bool value, void *dst, int64_t dst_slot, const void *src, int64_t src_slot) {
  for (int32_t h = 0; h < s->hkv; h++) copy_head(s, value, dst, dst_slot, src, src_slot, h);
}

/* ---- this rank's share of the cache ---------------------------------------------------------------------- */

/* The global slot of request r's position p, or -1 where its block table has no block there (past the
 * blocks the request needs). */
static int64_t global_slot(const step *s, int32_t r, int64_t p, int32_t seq_len) {
  const int64_t bs = s->block_size, b = p / bs;
  if (b >= (seq_len + bs - 1) / bs) return -1;
  return (int64_t)s->table[(size_t)r * s->stride + b] * bs + p % bs;
}

/* One local block of a request before deduplication: the global slots its block_size positions hold. */
typedef struct local_key {
  const int64_t *slots;
  int32_t index; /* in request order, then block order */
} local_key;

static size_t key_len; /* block_size, for the comparisons (qsort passes no context) */

static int compare_slots(const int64_t *a, const int64_t *b) { return memcmp(a, b, key_len * sizeof(int64_t)); }

static int compare_keys(const void *a, const void *b) {
  const local_key *x = a, *y = b;
  const int c = compare_slots(x->slots, y->slots);
  return c ? c : (x->index > y->index) - (x->index < y->index);
}

/* Builds this rank's block tables and caches. A local block is identified by the global slots it holds:
 * requests whose local blocks hold the same slots (a shared prefix: the same global blocks at the same
 * positions) get one local block, so this rank's planner finds the shared prefix as the whole step's does.
 * A local block holding a block one request writes is never shared, as the global table's rules keep that
 * block to one request. */
static int build_share(cp_run *r, const uattn_plan_info *whole) {
  const step *s = &r->s;
  const int32_t R = s->num_reqs, bs = s->block_size, N = num_ranks, I = r->interleave;
  r->local_len = malloc(sizeof(int32_t) * (size_t)R);
  if (!r->local_len) return runner_fail("out of memory for the local block tables");
  uattn_status st = uattn_compute_dcp_local_seq_lens(whole->seq_lens, R, N, my_rank, I, r->local_len, R);
  if (st) return runner_fail_lib("uattn_compute_dcp_local_seq_lens", st);

  int64_t entries = 0;
  int32_t stride = 1;
  for (int32_t q = 0; q < R; q++) {
    const int32_t blocks = (r->local_len[q] + bs - 1) / bs;
    entries += blocks;
    if (blocks > stride) stride = blocks;
  }
  if (entries > INT32_MAX / bs)
    return runner_fail("requests: %lld local blocks on rank %d overflow int32", (long long)entries, my_rank);
  int64_t *slots = malloc(sizeof(int64_t) * (size_t)(entries ? entries : 1) * (size_t)bs);
  local_key *keys = malloc(sizeof(local_key) * (size_t)(entries ? entries : 1));
  int32_t *first = malloc(sizeof(int32_t) * (size_t)(entries ? entries : 1)); /* a block's first occurrence */
  int32_t *id_of = malloc(sizeof(int32_t) * (size_t)(entries ? entries : 1)); /* its local block id */
  r->local_stride = stride;
  r->local_table = malloc(sizeof(int32_t) * (size_t)R * (size_t)stride);
  int rc = -1;
  if (!slots || !keys || !first || !id_of || !r->local_table) {
    runner_fail("out of memory for the local block tables");
    goto done;
  }

  /* every local block's global slots, in request order */
  int32_t e = 0;
  for (int32_t q = 0; q < R; q++)
    for (int32_t j = 0; j < (r->local_len[q] + bs - 1) / bs; j++, e++) {
      int64_t *k = slots + (size_t)e * bs;
      for (int32_t o = 0; o < bs; o++) {
        const int64_t lp = (int64_t)j * bs + o, p = lp / I * I * N + (int64_t)my_rank * I + lp % I;
        k[o] = global_slot(s, q, p, whole->seq_lens[q]);
      }
      keys[e] = (local_key){k, e};
    }
  /* equal keys end up next to each other, the first occurrence first; ids go in order of first use */
  key_len = (size_t)bs;
  qsort(keys, (size_t)entries, sizeof *keys, compare_keys);
  for (int32_t i = 0; i < entries; i++)
    first[keys[i].index] =
        i && !compare_slots(keys[i].slots, keys[i - 1].slots) ? first[keys[i - 1].index] : keys[i].index;
  int32_t n = 0;
  for (int32_t i = 0; i < entries; i++) id_of[i] = first[i] == i ? n++ : id_of[first[i]];
  e = 0;
  for (int32_t q = 0; q < R; q++) {
    int32_t *row = r->local_table + (size_t)q * stride;
    const int32_t blocks = (r->local_len[q] + bs - 1) / bs;
    for (int32_t j = 0; j < stride; j++) row[j] = j < blocks ? id_of[e + j] : -1;
    e += blocks;
  }

  /* the local caches, filled from the global ones (a rank without any position still gets one block: a
   * cache of none is refused) */
  r->num_local_blocks = n ? n : 1;
  const size_t local_slots = (size_t)r->num_local_blocks * (size_t)bs;
  r->local_slots = malloc(sizeof(int64_t) * local_slots);
  r->local_key_bytes = local_slots * cache_row_bytes(s, false);
  r->local_value_bytes = local_slots * cache_row_bytes(s, true);
  if (!r->local_slots || uattn_cache_alloc(r->local_key_bytes, &r->key_cache) ||
      (!s->kv_latent && uattn_cache_alloc(r->local_value_bytes, &r->value_cache))) {
    runner_fail("out of memory for rank %d's share of the caches (%zu + %zu bytes)", my_rank, r->local_key_bytes,
                r->local_value_bytes);
    goto done;
  }
  for (size_t i = 0; i < local_slots; i++) r->local_slots[i] = -1;
  for (int32_t i = 0; i < entries; i++) {
    if (first[i] != i) continue;
    for (int32_t o = 0; o < bs; o++) {
      const int64_t g = slots[(size_t)i * bs + o], l = (int64_t)id_of[i] * bs + o;
      r->local_slots[l] = g;
      if (g < 0) continue;
      copy_slot(s, false, r->key_cache, l, s->t[STEP_KEY_CACHE].a.data, g);
      if (!s->kv_latent) copy_slot(s, true, r->value_cache, l, s->t[STEP_VALUE_CACHE].a.data, g);
    }
  }
  rc = 0;
done:
  free(slots);
  free(keys);
  free(first);
  free(id_of);
  return rc;
}

/* ---- the step ------------------------------------------------------------------------------------------ */

/* Rank 0's buffers for the gathered partials, the merge and the cache writes. */
typedef struct gathered {
  float *parts;          /* [N, T, Hq, Dv]: the ranks' fp32 partials */
  float *part_lse;       /* [N, T, Hq] */
  float *merged, *lse;   /* [T, Hq, Dv], [T, Hq] */
  void *merged_out;      /* merged rounded to the step's dtype, as uattn-run's output is (NULL for f32) */
  int64_t *slots;        /* [N, T]: the global slot each rank wrote each token at, -1: not its token */
  void *k_rows, *v_rows; /* [N, T, Hkv, D] and [N, T, Hkv, Dv] in the cache dtype: what it wrote there */
  int *blocks;           /* [N, 2]: each rank's shared and unique blocks */
} gathered;

/* Each rank's cache writes, packed for the gather (rows of tokens another rank wrote are left unused). */
typedef struct written {
  int64_t *slots; /* [T] */
  void *k_rows, *v_rows;
} written;

/* A token's partial output, fp32 for every step dtype: what a rank sends per token besides its lse. */
static size_t part_row_bytes(const step *s) { return (size_t)s->hq * (size_t)s->head_dim_v * sizeof(float); }

static void gathered_free(gathered *g) {
  free(g->parts);
  free(g->part_lse);
  free(g->merged);
  free(g->lse);
  free(g->merged_out);
  free(g->slots);
  free(g->k_rows);
  free(g->v_rows);
  free(g->blocks);
}

static int gathered_alloc(gathered *g, const step *s) {
  const size_t N = (size_t)num_ranks, T = (size_t)s->num_tokens, rows = T * (size_t)s->hq;
  const size_t n = rows * (size_t)s->head_dim_v;
  memset(g, 0, sizeof *g);
  g->parts = malloc(N * T * part_row_bytes(s));
  g->part_lse = malloc(sizeof(float) * N * rows);
  g->merged = malloc(sizeof(float) * n);
  g->lse = malloc(sizeof(float) * rows);
  g->slots = malloc(sizeof(int64_t) * N * T);
  g->k_rows = malloc(N * T * cache_row_bytes(s, false));
  g->v_rows = malloc(N * T * cache_row_bytes(s, true) + 1);
  g->blocks = malloc(sizeof(int) * 2 * N);
  bool ok = g->parts && g->part_lse && g->merged && g->lse && g->slots && g->k_rows && g->v_rows && g->blocks;
  if (ok && s->dtype != UATTN_F32) ok = (g->merged_out = malloc(n * uattn_dtype_size(s->dtype))) != NULL;
  return ok ? 0 : runner_fail("out of memory for the gathered partials (%zu ranks x %zu rows)", N, rows);
}

/* The rank's plan config: the step's limits, its own cache, its place among the ranks. */
static uattn_plan_config local_config(const cp_run *r) {
  uattn_plan_config pc = step_plan_config(&r->s);
  pc.num_blocks = r->num_local_blocks;
  pc.cp_size = num_ranks;
  pc.cp_rank = my_rank;
  pc.cp_interleave = r->interleave;
  return pc;
}

static uattn_step local_batch(const cp_run *r) {
  uattn_step b = step_batch(&r->s);
  b.block_table = r->local_table;
  b.block_table_stride = r->local_stride;
  return b;
}

static int local_forward(cp_run *r) {
  const uattn_layer layer = step_layer(&r->s);
  uattn_tensors t = runner_tensors(&r->s, r->key_cache, r->value_cache, r->num_local_blocks, r->out, r->lse);
  t.out_f32 = true; /* the partial unrounded: the merge rounds once */
  const uattn_status st = uattn_forward(r->plan, &layer, &t, r->rt);
  return st ? runner_fail_lib("uattn_forward", st) : 0;
}

/* Everything up to the forward, on every rank: the whole step planned as uattn-run plans it (so a bad step
 * is refused with uattn-run's words), this rank's share, its plan, the runtime, the outputs. */
static int prepare(cp_run *r, gathered *g, written *w) {
  const step *s = &r->s;
  uattn_plan_info whole;
  if (runner_plan_step(s, "uattn-run-cp", &r->whole, &whole)) return -1;
  if (my_rank == 0 && (step_make_dir(r->o.out_dir, runner_error, sizeof runner_error) || gathered_alloc(g, s)))
    return -1;

  if (build_share(r, &whole)) return -1;
  const uattn_plan_config pc = local_config(r);
  uattn_status st = uattn_plan_create(&pc, &r->plan);
  if (st) return runner_fail_lib("uattn_plan_create", st);
  const uattn_step local = local_batch(r);
  if ((st = uattn_plan_step(r->plan, &local))) return runner_fail_lib("uattn_plan_step", st);
  if (runner_runtime(r->threads ? r->threads : s->threads, &r->rt)) return -1;

  const size_t T = (size_t)s->num_tokens;
  r->out = malloc(T * part_row_bytes(s));
  r->lse = malloc(sizeof(float) * T * (size_t)s->hq);
  w->slots = malloc(sizeof(int64_t) * T);
  w->k_rows = calloc(T, cache_row_bytes(s, false));
  w->v_rows = calloc(T * cache_row_bytes(s, true) + 1, 1);
  if (!r->out || !r->lse || !w->slots || !w->k_rows || !w->v_rows) return runner_fail("out of memory for the outputs");
  return 0;
}

/* The rank's cache writes of this step, read back from its caches: the tokens its plan gave a slot. */
static void pack_writes(const cp_run *r, written *w) {
  const step *s = &r->s;
  uattn_plan_info in;
  uattn_plan_get_info(r->plan, &in);
  const size_t es = uattn_dtype_size(s->cache_dtype), krow = cache_row_bytes(s, false), vrow = cache_row_bytes(s, true);
  const size_t kd = (size_t)s->head_dim * es, vd = (size_t)s->head_dim_v * es;
  for (int32_t t = 0; t < s->num_tokens; t++) {
    const int64_t l = in.slot_mapping[t];
    w->slots[t] = l < 0 ? -1 : r->local_slots[l];
    if (l < 0) continue;
    for (int32_t h = 0; h < s->hkv; h++) {
      copy_head(s, false, (char *)w->k_rows + t * krow + (size_t)h * kd, -1, r->key_cache, l, h);
      if (!s->kv_latent) copy_head(s, true, (char *)w->v_rows + t * vrow + (size_t)h * vd, -1, r->value_cache, l, h);
    }
  }
}

/* Collective: the fp32 partials to rank 0 in rank order, merged there in fp32 and rounded once to the step's
 * dtype (merged_out): the single rounding uattn-run's forward makes of its own fp32 result. */
static int gather_merge(cp_run *r, gathered *g) {
  const step *s = &r->s;
  const int T = s->num_tokens;
  MPI_Datatype out_row, lse_row;
  MPI_Type_contiguous(s->hq * s->head_dim_v, MPI_FLOAT, &out_row);
  MPI_Type_contiguous(s->hq, MPI_FLOAT, &lse_row);
  MPI_Type_commit(&out_row);
  MPI_Type_commit(&lse_row);
  MPI_Gather(r->out, T, out_row, g->parts, T, out_row, 0, MPI_COMM_WORLD);
  MPI_Gather(r->lse, T, lse_row, g->part_lse, T, lse_row, 0, MPI_COMM_WORLD);
  MPI_Type_free(&out_row);
  MPI_Type_free(&lse_row);
  if (my_rank != 0) return 0;

  const size_t rows = (size_t)T * (size_t)s->hq, n = rows * (size_t)s->head_dim_v;
  const float *outs[num_ranks], *lses[num_ranks];
  for (int i = 0; i < num_ranks; i++) {
    outs[i] = g->parts + i * n;
    lses[i] = g->part_lse + i * rows;
  }
  const uattn_status st = uattn_merge_states(num_ranks, outs, lses, T, s->hq, s->head_dim_v, g->merged, g->lse);
  if (st) return runner_fail_lib("uattn_merge_states", st);
  if (g->merged_out) uattn_narrow(s->dtype, g->merged, g->merged_out, n);
  return 0;
}

/* Collective: the cache writes to rank 0, which puts them into the global caches (the step's own arrays:
 * their shares were copied out before the forward). Every token the whole step writes must have been
 * written by exactly one rank, at the whole step's slot. */
static int gather_writes(cp_run *r, gathered *g, const written *w) {
  step *s = &r->s;
  const int T = s->num_tokens;
  MPI_Datatype krow, vrow;
  MPI_Type_contiguous((int)cache_row_bytes(s, false), MPI_BYTE, &krow);
  MPI_Type_commit(&krow);
  MPI_Gather(w->slots, T, MPI_INT64_T, g->slots, T, MPI_INT64_T, 0, MPI_COMM_WORLD);
  MPI_Gather(w->k_rows, T, krow, g->k_rows, T, krow, 0, MPI_COMM_WORLD);
  MPI_Type_free(&krow);
  if (!s->kv_latent) {
    MPI_Type_contiguous((int)cache_row_bytes(s, true), MPI_BYTE, &vrow);
    MPI_Type_commit(&vrow);
    MPI_Gather(w->v_rows, T, vrow, g->v_rows, T, vrow, 0, MPI_COMM_WORLD);
    MPI_Type_free(&vrow);
  }
  if (my_rank != 0) return 0;

  uattn_plan_info whole;
  uattn_plan_get_info(r->whole, &whole);
  const size_t es = uattn_dtype_size(s->cache_dtype), kbytes = cache_row_bytes(s, false),
               vbytes = cache_row_bytes(s, true), kd = (size_t)s->head_dim * es, vd = (size_t)s->head_dim_v * es;
  for (int32_t t = 0; t < T; t++) {
    int writer = -1, writers = 0;
    for (int i = 0; i < num_ranks; i++)
      if (g->slots[(size_t)i * T + t] >= 0) writer = i, writers++;
    const int64_t want = whole.slot_mapping[t];
    if (writers != (want >= 0) || (writer >= 0 && g->slots[(size_t)writer * T + t] != want))
      return runner_fail(
          "token %d: %d ranks wrote it (rank %d at global slot %lld); the whole step writes slot %lld "
          "(uattn-run-cp or library bug)",
          t, writers, writer, writer >= 0 ? (long long)g->slots[(size_t)writer * T + t] : -1LL, (long long)want);
    if (writer < 0) continue;
    const size_t row = (size_t)writer * T + (size_t)t;
    for (int32_t h = 0; h < s->hkv; h++) {
      copy_head(s, false, s->t[STEP_KEY_CACHE].a.data, want, (char *)g->k_rows + row * kbytes + h * kd, -1, h);
      if (!s->kv_latent)
        copy_head(s, true, s->t[STEP_VALUE_CACHE].a.data, want, (char *)g->v_rows + row * vbytes + h * vd, -1, h);
    }
  }
  return 0;
}

/* Collective: gathers, merges and (rank 0) writes the step's results. */
static int collect(cp_run *r, gathered *g, written *w) {
  pack_writes(r, w);
  int rc = gather_merge(r, g);
  rc = gather_writes(r, g, w) || rc;
  /* each rank's shared and unique blocks: a shared prefix must stay shared on every rank */
  uattn_plan_info mine;
  uattn_plan_get_info(r->plan, &mine);
  const int blocks[2] = {mine.num_shared_blocks, mine.num_unique_blocks};
  MPI_Gather(blocks, 2, MPI_INT, g->blocks, 2, MPI_INT, 0, MPI_COMM_WORLD);
  if (rc || my_rank != 0) return rc;
  uattn_plan_info whole;
  uattn_plan_get_info(r->whole, &whole);
  const void *out = g->merged_out ? g->merged_out : g->merged;
  if (step_write_results(&r->s, r->o.out_dir, out, g->lse, r->s.t[STEP_KEY_CACHE].a.data,
                         r->s.t[STEP_VALUE_CACHE].a.data, runner_error, sizeof runner_error) ||
      step_write_plan(&whole, r->o.out_dir, runner_error, sizeof runner_error))
    rc = -1;
  if (!rc) {
    printf(
        "uattn-run-cp: %d ranks (interleave %d): %d requests, %d query rows, %d sampled; shared/unique blocks "
        "by rank:",
        num_ranks, r->interleave, whole.num_reqs, whole.num_tokens, whole.num_logits);
    for (int i = 0; i < num_ranks; i++) printf(" %d/%d", g->blocks[2 * i], g->blocks[2 * i + 1]);
    printf("; wrote %s\n", r->o.out_dir);
  }
  return rc;
}

/* ---- timing ------------------------------------------------------------------------------------------ */

/* Collective: r->o.repeat more steps, each timed from a barrier to rank 0's merged result: this rank's plan
 * and forward, then the gather and the merge. The forward rewrites the step's own keys and values at the
 * same slots, so the caches do not change between runs. */
static int time_steps(cp_run *r, gathered *g) {
  const step *s = &r->s;
  const int n = r->o.repeat;
  /* per step: rank 0's wall time; each rank's plan + forward in wall and CPU time, and their maximum */
  double *step_ms = calloc((size_t)n, sizeof(double)), *compute_ms = calloc(2 * (size_t)n, sizeof(double)),
         *slowest_ms = calloc(2 * (size_t)n, sizeof(double));
  int rc = agree(!step_ms || !compute_ms || !slowest_ms ? runner_fail("--repeat: out of memory") : 0);
  const uattn_step local = local_batch(r);
  for (int i = 0; !rc && i < n; i++) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = perf_seconds(), c0 = perf_cpu_seconds();
    const uattn_status st = uattn_plan_step(r->plan, &local);
    rc = st ? runner_fail_lib("uattn_plan_step (repeat)", st) : local_forward(r);
    compute_ms[i] = (perf_seconds() - t0) * 1e3;
    compute_ms[n + i] = (perf_cpu_seconds() - c0) * 1e3;
    if ((rc = agree(rc))) break;
    rc = agree(gather_merge(r, g));
    step_ms[i] = (perf_seconds() - t0) * 1e3;
  }
  if (!rc) MPI_Reduce(compute_ms, slowest_ms, 2 * n, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

  /* what moves between the ranks per step (the fp32 partials and lse each sends: T x Hq x (4 Dv + 4) bytes,
   * whatever the step's dtype) against the KV bytes each holds for the step's requests: what a decode reads */
  int64_t kv = 0, kv_max = 0, kv_sum = 0;
  for (int32_t q = 0; q < s->num_reqs; q++) kv += (int64_t)r->local_len[q];
  kv *= (int64_t)(cache_row_bytes(s, false) + cache_row_bytes(s, true));
  if (!rc) {
    MPI_Reduce(&kv, &kv_max, 1, MPI_INT64_T, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&kv, &kv_sum, 1, MPI_INT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  }
  if (!rc && my_rank == 0) {
    const double gathered_bytes = (double)s->num_tokens * (double)(part_row_bytes(s) + sizeof(float) * s->hq);
    const double step_med = perf_median(step_ms, n), compute_med = perf_median(slowest_ms, n),
                 cpu_med = perf_median(slowest_ms + n, n);
    cJSON *t = cJSON_CreateObject();
    if (!t || !cJSON_AddNumberToObject(t, "ranks", num_ranks) ||
        !cJSON_AddNumberToObject(t, "interleave", r->interleave) ||
        !cJSON_AddNumberToObject(t, "threads", runner_workers(r->rt)) || !cJSON_AddNumberToObject(t, "repeat", n) ||
        !cJSON_AddNumberToObject(t, "step_ms", step_med) || !cJSON_AddNumberToObject(t, "compute_ms", compute_med) ||
        !cJSON_AddNumberToObject(t, "compute_cpu_ms", cpu_med) ||
        !cJSON_AddNumberToObject(t, "gathered_bytes_per_rank", gathered_bytes) ||
        !cJSON_AddNumberToObject(t, "kv_bytes_per_rank", (double)kv_max) ||
        !cJSON_AddNumberToObject(t, "kv_bytes", (double)kv_sum))
      rc = runner_fail("timing.json: out of memory");
    else
      rc = step_write_json(r->o.out_dir, "timing.json", t, runner_error, sizeof runner_error);
    cJSON_Delete(t);
    if (!rc)
      printf(
          "uattn-run-cp: median of %d steps on %d ranks: %.3f ms a step (slowest rank's plan + forward %.3f ms, "
          "%.3f ms of CPU); %.0f bytes gathered per rank against %.0f KV bytes on the busiest rank\n",
          n, num_ranks, step_med, compute_med, cpu_med, gathered_bytes, (double)kv_max);
  }
  free(step_ms);
  free(compute_ms);
  free(slowest_ms);
  return rc;
}

/* ---- main --------------------------------------------------------------------------------------------- */

/* --interleave and --threads, uattn-run-cp's own options. */
static int own_option(void *tool, int argc, char **argv, int *i) {
  cp_run *r = tool;
  if (perf_is_option(argv[*i], "--interleave"))
    return runner_parse_count("--interleave", perf_option_value("--interleave", argc, argv, i), 1 << 20,
                              &r->interleave);
  if (perf_is_option(argv[*i], "--threads"))
    return runner_parse_count("--threads", perf_option_value("--threads", argc, argv, i), 1024, &r->threads);
  return 1;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &num_ranks);
  cp_run r;
  memset(&r, 0, sizeof r);
  r.interleave = 1;
  gathered g;
  memset(&g, 0, sizeof g);
  written w;
  memset(&w, 0, sizeof w);

  /* the same on every rank: mpirun gives each the same arguments */
  int rc = runner_parse_args(argc, argv, &r.o, own_option, &r, " (--help: the usage)");
  if (rc == 1) {
    if (my_rank == 0) fputs(usage_text, stdout);
    MPI_Finalize();
    return 0;
  }
  rc = agree(rc);
  if (!rc) rc = agree(step_read(&r.s, r.o.json_path, runner_error, sizeof runner_error));
  if (!rc) rc = agree(prepare(&r, &g, &w) || local_forward(&r));
  if (!rc) rc = agree(collect(&r, &g, &w));
  if (!rc && r.o.repeat) rc = agree(time_steps(&r, &g));
  if (rc) fprintf(stderr, "uattn-run-cp: %s\n", runner_error);
  free(w.slots);
  free(w.k_rows);
  free(w.v_rows);
  gathered_free(&g);
  run_free(&r);
  MPI_Finalize();
  return rc ? EXIT_BAD : 0;
}
