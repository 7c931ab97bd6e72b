/* One forward call on its workers: this step's keys and values into the caches, then the attention in work
 * units, then the merge of split requests. Work units are (item, piece, KV head) triples, handed out largest
 * item first (an item is a request, or a prefix run of decodes: plan/schedule.h); an item's pieces are its
 * splits (a long decode's key ranges) or its row tiles (a prompt of more than one tile, each tile a unit, so
 * that a prefill on one KV head runs on several workers). A unit writes only its own rows and heads, or, for
 * a split, its own slot of partial states, which a second pass merges in split order. Items and splits are
 * the plan's, and each tile computes alone (its states cleared, its rows merged into out at its end), so the
 * answer does not depend on which worker runs a unit, or on how many workers there are. */
#include <stdatomic.h>
#include <string.h>

#include "attention/forward_internal.h"
#include "attention/merge.h"
#include "threads/pool.h"

#define UATTN_MAX_NODES 16 /* NUMA nodes the work handout distinguishes; more share queues */

/* One forward call, shared by its workers. */
typedef struct forward_job {
  uattn_schedule sched;
  const uattn_layer *L;
  const uattn_tensors *t;
  uattn_runtime *rt;
  cache_view cache;
  workspace shape;
  size_t scratch_bytes; /* a worker's workspace */
  size_t split_floats;  /* one (row, split) slot a KV head: [group][shared, unique][m, l, o[Dv]] */
  float *splits;        /* all split slots, after worker 0's workspace */
  /* NUMA: KV head g belongs to node g % num_nodes; a worker takes its node's units first, then helps the
   * others, so on a multi-node machine each node mostly reads its own heads. One node: one queue. */
  int32_t num_nodes;
  atomic_int node_next[UATTN_MAX_NODES];
  atomic_int next_unit;
  atomic_int out_of_memory;
  atomic_llong part_calls[UATTN_NUM_PARTS], decode_calls[UATTN_NUM_PARTS];
  int32_t max_workers;  /* workers that take units (a tuning file may ask for fewer than the runtime has) */
  int32_t head_group;   /* KV heads an all-heads unit takes (all_heads_group) */
  int32_t *piece_begin; /* [num_items + 1]: item pos's pieces are [piece_begin[pos], piece_begin[pos + 1]) */
  size_t step_kv_bytes; /* of step_kv (uattn_step_kv_bytes), 0 when the causal part reads k and v themselves */
  char *step_kv;        /* in worker 0's scratch: [2][T][Hkv][D] in the cache dtype (a latent: [T][Hkv][D]), or NULL */
  head_dims dims;       /* the layer's (kernel_choice.h) */
} forward_job;

/* A split slot's state: m, l and the out dims of o (the rest of the kernels' o is never read). */
static size_t split_state_floats(int32_t Dv) { return (size_t)Dv + 2; }

/* Unit j of node n's queue: the split index and the n-th share of the KV heads. Returns -1 past its end. */
static int32_t node_unit(const forward_job *job, int32_t node, int32_t j) {
  const int32_t Hkv = job->L->num_kv_heads, n = job->num_nodes;
  const int32_t heads = Hkv / n + (node < Hkv % n); /* g = node, node + n, ... */
  if (heads == 0 || j >= job->piece_begin[job->sched.num_items] * heads) return -1;
  return (j / heads) * Hkv + node + (j % heads) * n;
}

/* The partial state of (head, accumulator: 0 shared, 1 unique) in a (row, split) slot. */
static float *split_slot_at(const forward_job *job, int32_t slot, int32_t kv_head, int32_t head, int acc) {
  return job->splits + ((size_t)slot * job->L->num_kv_heads + kv_head) * job->split_floats +
         ((size_t)head * 2 + acc) * split_state_floats(job->dims.v);
}

static uattn_state split_state(const forward_job *job, int32_t slot, int32_t kv_head, int32_t head, int acc) {
  float *x = split_slot_at(job, slot, kv_head, head, acc);
  uattn_state s = {x[0], x[1], x + 2};
  return s;
}

static void store_split_state(const forward_job *job, int32_t slot, int32_t kv_head, int32_t head, int acc,
                              const uattn_state *st) {
  float *x = split_slot_at(job, slot, kv_head, head, acc);
  x[0] = st->m;
  x[1] = st->l;
}

/* First pass: every worker gets its scratch before anything is written, so a failure changes nothing.
 * Worker 0's also holds the split slots, which every worker writes, piece_begin and step_kv. Each worker
 * reserves its own (a fresh page is first touched on its NUMA node), in a run of its own only where one must
 * grow (other_scratch_fits): otherwise the caller, worker 0, reserves its own alone, so that sleeping workers
 * are not woken for nothing. */
static void reserve_scratch(void *ctx, int32_t worker, int32_t num_workers) {
  (void)num_workers;
  forward_job *job = ctx;
  const size_t slots = (size_t)job->sched.split_slot[job->sched.num_items] * job->L->num_kv_heads;
  const size_t split_bytes = slots * job->split_floats * sizeof(float);
  const size_t begin_bytes = (sizeof(int32_t) * ((size_t)job->sched.num_items + 1) + 63) & ~(size_t)63;
  const size_t bytes = job->scratch_bytes + (worker == 0 ? split_bytes + begin_bytes + job->step_kv_bytes : 0);
  char *p = uattn_worker_scratch(job->rt, worker, bytes);
  if (!p) {
    atomic_store(&job->out_of_memory, 1);
  } else if (worker == 0) {
    job->splits = (float *)(p + job->scratch_bytes);
    job->piece_begin = (int32_t *)(p + job->scratch_bytes + split_bytes);
    job->step_kv = job->step_kv_bytes ? p + job->scratch_bytes + split_bytes + begin_bytes : NULL;
  }
}

/* Whether every worker but the caller already has its scratch (reserve_scratch would not grow it). */
static bool other_scratch_fits(const forward_job *job) {
  for (int32_t w = 1; w < uattn_runtime_workers(job->rt); w++)
    if (!uattn_worker_scratch_fits(job->rt, w, job->scratch_bytes)) return false;
  return true;
}

/* ---- a tile: its queries and states in, its rows out ------------------------------------------------- */

/* Rows ahead of the one converted whose query or output vectors are asked for (prefetch_vectors). */
#define ROWS_AHEAD 8

/* Asks for a row's `bytes` of query (rw 0) or output (rw 1) vectors from p on, whole lines. A tile reads the
 * vectors of one KV head's group in every row: a few lines of every Hq * D elements, far apart, which the
 * hardware prefetchers do not follow, and cold at the tile's start; asked for ROWS_AHEAD rows before their
 * turn, their misses overlap. */
#define prefetch_vectors(p, bytes, rw)                                                                                 \
  do {                                                                                                                 \
    const char *at_ = (const char *)(p);                                                                               \
    for (size_t b_ = 0; b_ < (bytes); b_ += 64) __builtin_prefetch(at_ + b_, rw, 3);                                   \
  } while (0)

/* The tile's queries in its slots, times cache_score_scale's scale (every part's) for the kernels that take them
 * scaled, zeros after their own dims up to the kernels' head dim; in q_decode too where the decode kernels take
 * them otherwise than the attend (workspace.q_decode). */
static void widen_queries(const forward_job *job, const step_ctx *c) {
  const uattn_layer *L = job->L;
  const float scale = cache_score_scale(L);
  workspace *w = c->w;
  const int32_t D = job->dims.k, W = c->dim, Hq = L->num_q_heads;
  const size_t qsz = uattn_dtype_size(L->dtype), group_bytes = (size_t)w->group * D * qsz;
  for (int32_t i = 0; i < c->rows; i++) {
    if (i + ROWS_AHEAD < c->rows)
      prefetch_vectors(
          (const char *)job->t->q + ((size_t)(c->row0 + i + ROWS_AHEAD) * Hq + (size_t)c->kv_head * w->group) * D * qsz,
          group_bytes, 0);
    for (int32_t h = 0; h < w->group; h++) {
      const size_t slot = ((size_t)(c->slot + i) * w->group + h) * W;
      float *q = w->q + slot;
      const size_t at = ((size_t)(c->row0 + i) * Hq + (size_t)c->kv_head * w->group + h) * D * qsz;
      uattn_widen(L->dtype, (const char *)job->t->q + at, q, (size_t)D);
      for (int32_t d = D; d < W; d++) q[d] = 0.0f;
      if (w->q_decode != w->q) memcpy(w->q_decode + slot, q, sizeof(float) * (size_t)W);
      /* the Gaudi plugin scales the query; a bf16 kernel scales its scores instead (uattn_kernel_caps.unscaled_q) */
      if (!w->kern->caps.unscaled_q)
        for (int32_t d = 0; d < D; d++) q[d] *= scale;
      if (w->q_decode != w->q && !w->kern->caps.decode_unscaled_q)
        for (int32_t d = 0; d < D; d++) w->q_decode[slot + d] *= scale;
    }
  }
}

/* Under context parallelism outside pieces, the query position the kernels get for a row at global position
 * pos (parts.c: context parallelism): with a window W the kernel sees local keys from query - W + 1 on, which
 * must be the first local key past pos - W; without one (and without ALiBi) the kernels do not read it. */
static int32_t local_query_pos(const step_ctx *c, int32_t pos) {
  const int32_t W = c->L->attn_type == UATTN_ATTENTION_DECODER ? c->L->sliding_window : 0;
  return W > 0 ? uattn_cp_local_len(c->cp, pos - W + 1 > 0 ? pos - W + 1 : 0) + W - 1 : pos;
}

/* Clears an accumulator's states for rows [slot, slot + rows): m and l always, o unless the tile never runs
 * the part (outputs false). A part's first kernel call multiplies o by e^(-inf) = 0, so o must start at 0
 * where it runs; where it does not, m and l alone keep it out of every merge (part_seen). */
static void reset_acc(workspace *w, int acc, int32_t slot, int32_t rows, int32_t D, bool outputs) {
  for (int32_t i = slot; i < slot + rows; i++)
    for (int32_t h = 0; h < w->group; h++) {
      const size_t idx = state_index(w, acc, i, h);
      w->state_m[idx] = -INFINITY, w->state_l[idx] = 0.0f;
      if (outputs) memset(w->state_o + idx * D, 0, sizeof(float) * (size_t)D);
    }
}

/* The tile's scaled queries in its slots (widen_queries), and its partial states cleared: the outputs of the
 * cache parts only when the tile reads the cache (reads_cache), since a prompt with nothing cached runs the
 * causal part alone and clearing the others' outputs would be a pass over megabytes for nothing. */
static void begin_tile(const forward_job *job, const step_ctx *c, bool reads_cache) {
  widen_queries(job, c);
  if (c->cp && !c->pieces)
    for (int32_t i = 0; i < c->rows; i++)
      c->w->query_pos[c->slot + i] = local_query_pos(c, c->in->token_positions[c->row0 + i]);
  for (int acc = 0; acc < NUM_ACCS; acc++)
    reset_acc(c->w, acc, c->slot, c->rows, c->dim, acc == ACC_CAUSAL || reads_cache);
}

/* Whether a part saw a key: else it is as reset_acc left it (m -inf, l 0; o 0, or not reset at all in a tile
 * that never runs the part), and the merge leaves it out (seen_parts). */
static bool part_seen(const uattn_state *s) { return s->l != 0.0f || s->m != -INFINITY; }

/* The out dims of the parts' unnormalized outputs, times v_scale on an fp8 cache (forward_internal.h:
 * cache_score_scale), those that saw a key: the others' o is not read. */
static void fold_v_scale(const uattn_layer *L, int32_t Dv, uattn_state *parts, int32_t n) {
  if (!uattn_dtype_is_fp8(L->cache_dtype)) return;
  const float vs = L->v_scale;
  for (int32_t k = 0; k < n; k++) {
    if (!part_seen(&parts[k])) continue;
    float *o = parts[k].o; /* the test above once, so that the loop vectorizes */
    for (int32_t d = 0; d < Dv; d++) o[d] *= vs;
  }
}

/* Moves the parts that saw a key to the front and returns their count. A part that saw none is as reset_acc
 * left it (m -inf, l 0, o 0): the seed's merge adds 0 to every sum for it, so leaving it out changes no bit,
 * and it skips an expf of -FLT_MAX - M, libm's slow underflow path. */
static int32_t seen_parts(uattn_state *parts, int32_t n) {
  int32_t k = 0;
  for (int32_t i = 0; i < n; i++)
    if (part_seen(&parts[i])) parts[k++] = parts[i];
  return k;
}

/* Merges the tile's three parts into out and lse; a function of its own, as the parts are (parts.c: PART_FN). */
static __attribute__((noinline)) void merge_tile(const step_ctx *c) {
  const uattn_layer *L = c->L;
  const int32_t D = c->dim, Dv = layer_dims(L).v, Hq = L->num_q_heads;
  const uattn_dtype odt = out_dtype(L, c->t);
  const size_t osz = uattn_dtype_size(odt);
  float row_out[UATTN_MAX_HEAD_DIM];
  for (int32_t i = 0; i < c->rows; i++) {
    if (i + ROWS_AHEAD < c->rows)
      prefetch_vectors(
          (char *)c->t->out + ((size_t)(c->row0 + i + ROWS_AHEAD) * Hq + (size_t)c->kv_head * c->w->group) * Dv * osz,
          (size_t)c->w->group * Dv * osz, 1);
    for (int32_t g = 0; g < c->w->group; g++) {
      const int32_t h = c->kv_head * c->w->group + g, row = c->row0 + i, x = c->slot + i;
      uattn_state parts[3] = {acc_state(c->w, ACC_CAUSAL, x, g, D), acc_state(c->w, ACC_SHARED, x, g, D),
                              acc_state(c->w, ACC_UNIQUE, x, g, D)};
      fold_v_scale(L, Dv, parts, 3); /* the tile is done with them: scaled in place */
      const float lse = uattn_merge_parts(parts, seen_parts(parts, 3), L->sinks ? L->sinks[h] : -INFINITY, Dv, row_out);
      uattn_narrow(odt, row_out, (char *)c->t->out + ((size_t)row * Hq + h) * Dv * osz, (size_t)Dv);
      if (c->t->lse) c->t->lse[(size_t)row * Hq + h] = lse;
    }
  }
}

/* The tile's rows done: merged into out, or, in a split unit, its shared and unique states kept in the
 * split's slots for the merge pass. */
static void end_tile(const forward_job *job, const step_ctx *c, int32_t pos, int32_t split) {
  const uattn_schedule *sched = &job->sched;
  if (sched->split_begin[pos + 1] - sched->split_begin[pos] <= 1) {
    merge_tile(c);
    return;
  }
  const int32_t D = c->dim, Dv = job->dims.v;
  const int32_t slot = sched->split_slot[pos] + split * (c->qe - c->qs) + (c->row0 - c->qs); /* of row0 */
  for (int32_t i = 0; i < c->rows; i++)
    for (int32_t h = 0; h < c->w->group; h++)
      for (int acc = 0; acc < 2; acc++) {
        const uattn_state from = acc_state(c->w, acc == 0 ? ACC_SHARED : ACC_UNIQUE, c->slot + i, h, D);
        uattn_state to = split_state(job, slot + i, c->kv_head, h, acc);
        memcpy(to.o, from.o, sizeof(float) * (size_t)Dv);
        store_split_state(job, slot + i, c->kv_head, h, acc, &from);
      }
}

/* ---- the units --------------------------------------------------------------------------------------- */

/* The tile of rows [row0, row0 + rows) of the item's requests [first, end) (rows [qs, qe)) on KV head g; a
 * split unit covers keys [split * split_keys, (split + 1) * split_keys) of its one request's context. */
static step_ctx tile_ctx(const forward_job *job, workspace *w, int32_t pos, int32_t g, int32_t split, int32_t first,
                         int32_t end, int32_t row0, int32_t rows, int32_t slot) {
  const uattn_schedule *sched = &job->sched;
  const uattn_plan_info *in = sched->info;
  step_ctx c = {.sched = sched,
                .in = in,
                .L = job->L,
                .t = job->t,
                .cache = job->cache,
                .w = w,
                .kv_head = g,
                .req = first,
                .row0 = row0,
                .rows = rows,
                .slot = slot,
                .qs = in->query_start_loc[first],
                .qe = in->query_start_loc[end],
                .num_computed = uattn_cp_local_len(sched->config, in->token_positions[in->query_start_loc[first]]),
                .key_lo = 0,
                .key_hi = INT32_MAX,
                .heads = 1,
                .dim = job->dims.kernel,
                .step_k = job->step_kv ? job->step_kv : (const char *)job->t->k,
                .step_v = job->step_kv ? job->step_kv + job->step_kv_bytes / 2 : (const char *)job->t->v,
                .step_dtype = job->step_kv ? job->L->cache_dtype : job->L->dtype,
                .cp = sched->config->cp_size > 1 ? sched->config : NULL};
  c.pieces = c.cp && job->L->alibi_slopes;
  if (job->L->kv_latent) c.step_v = c.step_k; /* a latent's values are its keys */
  if (sched->split_begin[pos + 1] - sched->split_begin[pos] > 1)
    c.key_lo = split * sched->split_keys, c.key_hi = c.key_lo + sched->split_keys;
  return c;
}

/* Rows of the item's requests [first, end) on KV head g: the tile of rows from qs + tile * w->tile, or with
 * tile -1 every tile in turn. */
static void run_rows(forward_job *job, workspace *w, int32_t pos, int32_t g, int32_t split, int32_t first, int32_t end,
                     int32_t tile) {
  const uattn_plan_info *in = job->sched.info;
  const uattn_layer *L = job->L;
  const int32_t qs = in->query_start_loc[first], qe = in->query_start_loc[end];
  const bool causal = end - first == 1 && uattn_reads_step_keys(in, L, first); /* whether the causal part reads keys */
  const int32_t from = tile < 0 ? qs : qs + tile * w->tile, to = tile < 0 ? qe : from + 1;
  for (int32_t row0 = from; row0 < to; row0 += w->tile) {
    const step_ctx c = tile_ctx(job, w, pos, g, split, first, end, row0, qe - row0 < w->tile ? qe - row0 : w->tile, 0);
    begin_tile(job, &c, !causal || c.num_computed > 0);
    if (L->attn_type == UATTN_ATTENTION_ENCODER_DECODER) {
      uattn_cross_part(&c);
    } else if (end - first > 1) { /* a prefix run: no causal part */
      uattn_shared_part_prefix_run(&c, first, end);
      uattn_unique_part(&c);
    } else {
      uattn_causal_part(&c); /* split units are decodes: nothing to do here */
      uattn_shared_part(&c);
      uattn_unique_part(&c);
    }
    end_tile(job, &c, pos, split);
  }
}

/* A decode or a short verification (request r, its rows all reading the cache) on a cache of several heads,
 * the KV heads [g0, g0 + head_group) in one unit (every head, unless the step has few units: all_heads_group),
 * head g's rows from slot g * rows. Each run of blocks goes through the decode kernel for the unit's heads
 * together (parts.c: decode_call), straight from the cache, without panels: an NHD row holds every head, where
 * a unit of one head would read a few lines of every row, and a TILED tile every head in turn. */
static void run_all_heads(forward_job *job, workspace *w, int32_t pos, int32_t split, int32_t r, int32_t g0) {
  const uattn_plan_info *in = job->sched.info;
  const int32_t g1 = g0 + job->head_group, row0 = in->query_start_loc[r], rows = in->query_start_loc[r + 1] - row0;
  for (int32_t g = g0; g < g1; g++) {
    const step_ctx c = tile_ctx(job, w, pos, g, split, r, r + 1, row0, rows, g * rows);
    begin_tile(job, &c, true); /* cache-only rows */
  }
  step_ctx c0 = tile_ctx(job, w, pos, g0, split, r, r + 1, row0, rows, g0 * rows);
  c0.heads = job->head_group;
  uattn_shared_part_all_heads(&c0);
  uattn_unique_part_all_heads(&c0);
  for (int32_t g = g0; g < g1; g++) {
    const step_ctx c = tile_ctx(job, w, pos, g, split, r, r + 1, row0, rows, g * rows);
    end_tile(job, &c, pos, split);
  }
}

/* Whether an item runs as one all-heads unit (run_all_heads): one request that reads only the cache
 * (a decode, a verification), of at most all_heads_max_rows rows. */
static bool all_heads_item(const forward_job *job, int32_t pos) {
  const uattn_plan_info *in = job->sched.info;
  const uattn_layer *L = job->L;
  const int32_t r = job->sched.item_first[pos], rows = in->query_start_loc[r + 1] - in->query_start_loc[r];
  const bool pieces = job->sched.config->cp_size > 1 && L->alibi_slopes; /* step_ctx.pieces */
  return L->attn_type == UATTN_ATTENTION_DECODER && !pieces && job->shape.use.all_heads &&
         job->sched.item_reqs[pos] == 1 && !in->is_prompt[r] && rows <= uattn_all_heads_max_rows(job->shape.kern, L) &&
         rows * L->num_kv_heads <= job->shape.slots;
}

/* The row tiles of item pos that are units of their own: a lone request's (a prompt longer than a tile,
 * or any request under a causal width below its rows); 1 for an all-heads item and for a prefix run, whose
 * unit takes its tiles in turn. */
static int32_t item_tiles(const forward_job *job, int32_t pos) {
  if (job->sched.item_reqs[pos] != 1 || all_heads_item(job, pos)) return 1;
  const uattn_plan_info *in = job->sched.info;
  const int32_t r = job->sched.item_first[pos], rows = in->query_start_loc[r + 1] - in->query_start_loc[r];
  return rows > job->shape.tile ? (rows + job->shape.tile - 1) / job->shape.tile : 1;
}

/* Item pos's pieces: its splits times its tiles (both above 1 only where a causal width below a split
 * decode's few rows tiles it). */
static int32_t item_pieces(const forward_job *job, int32_t pos) {
  return (job->sched.split_begin[pos + 1] - job->sched.split_begin[pos]) * item_tiles(job, pos);
}

/* The step's (item, piece) pairs that run as all-heads units (*all), and its other units, one a KV head
 * (*other). */
static void count_units(const forward_job *job, int32_t *all, int32_t *other) {
  *all = *other = 0;
  for (int32_t pos = 0; pos < job->sched.num_items; pos++) {
    if (all_heads_item(job, pos))
      *all += item_pieces(job, pos);
    else
      *other += item_pieces(job, pos) * job->L->num_kv_heads;
  }
}

/* The KV heads an all-heads unit takes: all of them, or where the step's units would be fewer than the
 * workers (one long decode's splits on a many-core machine, a lone decode on two), the largest divisor of
 * the heads that makes enough of them: a decode call of fewer heads costs less than an idle worker. Each
 * head's arithmetic is the same whichever heads a decode call takes with it, so the answer does
 * not depend on the workers here either. */
static int32_t all_heads_group(const forward_job *job) {
  const int32_t Hkv = job->L->num_kv_heads, want = job->max_workers;
  int32_t all, other;
  count_units(job, &all, &other);
  if (job->max_workers <= 1 || all == 0) return Hkv;
  for (int32_t h = Hkv; h > 1; h--)
    if (Hkv % h == 0 && other + all * (Hkv / h) >= want) return h;
  return 1;
}

/* The units of the attention pass that do work (an all-heads unit's other heads' are empty). */
static int32_t working_units(const forward_job *job) {
  int32_t all, other;
  count_units(job, &all, &other);
  return other + all * (job->L->num_kv_heads / job->head_group);
}

/* Unit u: the item's position (by cost), the KV head, and the split and tile it stands for (tile -1: the
 * item's every tile). An item's last tile, the one that sees the most keys, goes first. */
static void unit_of(const forward_job *job, int32_t u, int32_t *pos, int32_t *kv_head, int32_t *split, int32_t *tile) {
  const int32_t *begin = job->piece_begin, x = u / job->L->num_kv_heads;
  int32_t lo = 0, hi = job->sched.num_items; /* the last pos with begin[pos] <= x */
  while (hi - lo > 1) {
    const int32_t mid = (lo + hi) / 2;
    if (begin[mid] <= x)
      lo = mid;
    else
      hi = mid;
  }
  const int32_t tiles = item_tiles(job, lo), piece = x - begin[lo];
  *pos = lo;
  *kv_head = u % job->L->num_kv_heads;
  *split = piece / tiles;
  *tile = tiles > 1 ? tiles - 1 - piece % tiles : -1;
}

static void run_unit(forward_job *job, workspace *w, int32_t unit) {
  const uattn_schedule *sched = &job->sched;
  int32_t pos, g, split, tile;
  unit_of(job, unit, &pos, &g, &split, &tile);
  const int32_t first = sched->item_first[pos], end = first + sched->item_reqs[pos];
  if (all_heads_item(job, pos)) {
    if (g % job->head_group == 0) run_all_heads(job, w, pos, split, first, g); /* the group's other units: here */
    return;
  }
  if (job->L->attn_type == UATTN_ATTENTION_DECODER) {
    run_rows(job, w, pos, g, split, first, end, tile);
    return;
  }
  /* groups serve decoder self-attention; other types take the group's requests one at a time */
  for (int32_t r = first; r < end; r++) run_rows(job, w, pos, g, split, r, r + 1, tile);
}

static void attention_job(void *ctx, int32_t worker, int32_t num_workers) {
  (void)num_workers;
  forward_job *job = ctx;
  if (worker >= job->max_workers) return;
  workspace w = job->shape;
  uattn_workspace_carve(&w, uattn_worker_scratch(job->rt, worker, job->scratch_bytes), job->dims.kernel);
  int32_t nodes;
  const int32_t home = uattn_worker_node(job->rt, worker, &nodes);
  for (int32_t k = 0; k < job->num_nodes; k++) { /* home first, then the others */
    const int32_t node = (home + k) % job->num_nodes;
    for (;;) {
      const int32_t unit = node_unit(job, node, atomic_fetch_add(&job->node_next[node], 1));
      if (unit < 0) break;
      run_unit(job, &w, unit);
    }
  }
  for (int p = 0; p < UATTN_NUM_PARTS; p++) {
    atomic_fetch_add(&job->part_calls[p], w.calls[p]);
    atomic_fetch_add(&job->decode_calls[p], w.decode_calls[p]);
  }
}

/* The merge pass over split requests: each (request, KV head) folds its splits in split order, then the
 * seed's merge writes the rows. */
static void merge_splits_job(void *ctx, int32_t worker, int32_t num_workers) {
  (void)worker, (void)num_workers;
  forward_job *job = ctx;
  const uattn_schedule *sched = &job->sched;
  const uattn_plan_info *in = sched->info;
  const uattn_layer *L = job->L;
  const int32_t D = job->dims.v, Hq = L->num_q_heads, G = job->shape.group;
  static const float zeros[UATTN_MAX_HEAD_DIM];
  float row_out[UATTN_MAX_HEAD_DIM];
  for (;;) {
    const int32_t unit = atomic_fetch_add(&job->next_unit, 1);
    if (unit >= sched->num_items * L->num_kv_heads) break;
    const int32_t pos = unit / L->num_kv_heads, g = unit % L->num_kv_heads;
    const int32_t splits = sched->split_begin[pos + 1] - sched->split_begin[pos];
    if (splits <= 1) continue;
    const int32_t r = sched->item_first[pos], qs = in->query_start_loc[r], slot0 = sched->split_slot[pos];
    const int32_t rows = in->query_start_loc[r + 1] - qs;
    for (int32_t row = qs; row < in->query_start_loc[r + 1]; row++)
      for (int32_t h = 0; h < G; h++) {
        uattn_state parts[3];
        parts[0] = (uattn_state){-INFINITY, 0.0f, (float *)zeros}; /* a decode has no causal part */
        for (int acc = 0; acc < 2; acc++) {
          parts[1 + acc] = split_state(job, slot0 + (row - qs), g, h, acc);
          for (int32_t sp = 1; sp < splits; sp++) {
            const uattn_state b = split_state(job, slot0 + sp * rows + (row - qs), g, h, acc);
            uattn_state_merge(&parts[1 + acc], &b, D);
          }
        }
        fold_v_scale(L, D, parts + 1, 2); /* split 0's slots, read once: scaled in place */
        const int32_t head = g * G + h;
        const float lse =
            uattn_merge_parts(parts, seen_parts(parts, 3), L->sinks ? L->sinks[head] : -INFINITY, D, row_out);
        const uattn_dtype odt = out_dtype(L, job->t);
        uattn_narrow(odt, row_out, (char *)job->t->out + ((size_t)row * Hq + head) * D * uattn_dtype_size(odt),
                     (size_t)D);
        if (job->t->lse) job->t->lse[(size_t)row * Hq + head] = lse;
      }
  }
}

uattn_status uattn_forward_run(const uattn_schedule *sched, const uattn_layer *L, const uattn_tensors *t,
                               uattn_runtime *rt, const uattn_kernel_choice *choice, int32_t max_workers,
                               uattn_kernel_report *report) {
  const uattn_plan_info *in = sched->info;
  const head_dims dims = layer_dims(L);
  forward_job job = {.sched = *sched,
                     .L = L,
                     .t = t,
                     .rt = rt,
                     .cache = {t->key_cache, L->kv_latent ? t->key_cache : t->value_cache, L->cache_dtype, L->kv_layout,
                               t->block_size, L->num_kv_heads, L->head_dim, L->kv_latent ? L->head_dim : dims.v},
                     .dims = dims};
  uattn_workspace_shape(&job.shape, in, L, choice, sched->config->cp_size > 1);
  job.scratch_bytes = uattn_workspace_bytes(&job.shape, dims.kernel);
  job.split_floats = (size_t)job.shape.group * 2 * split_state_floats(dims.v);
  job.step_kv_bytes = uattn_step_kv_bytes(in, L);
  job.max_workers = max_workers;
  job.head_group = all_heads_group(&job);
  atomic_init(&job.next_unit, 0);
  uattn_worker_node(rt, 0, &job.num_nodes);
  if (job.num_nodes > UATTN_MAX_NODES) job.num_nodes = UATTN_MAX_NODES;
  for (int32_t n = 0; n < UATTN_MAX_NODES; n++) atomic_init(&job.node_next[n], 0);
  for (int p = 0; p < UATTN_NUM_PARTS; p++) atomic_init(&job.part_calls[p], 0), atomic_init(&job.decode_calls[p], 0);
  atomic_init(&job.out_of_memory, 0);
  /* The passes share the workers' scratch (the split slots live in worker 0's): no other engine thread's
   * forward may run on rt between them. */
  const bool held = uattn_runtime_hold(rt);
  if (other_scratch_fits(&job))
    uattn_runtime_run_alone(rt, reserve_scratch, &job); /* worker 0 is this thread */
  else
    uattn_runtime_run(rt, reserve_scratch, &job);
  if (atomic_load(&job.out_of_memory)) {
    uattn_runtime_release(rt, held);
    return uattn_fail(UATTN_ERR_NO_MEMORY, "out of memory for the forward's workspace (%zu bytes a worker)",
                      job.scratch_bytes);
  }

  job.piece_begin[0] = 0;
  for (int32_t pos = 0; pos < sched->num_items; pos++)
    job.piece_begin[pos + 1] = job.piece_begin[pos] + item_pieces(&job, pos);
  /* the cache first: a decode row reads its own new key back from it, the causal part step_kv */
  if (L->attn_type != UATTN_ATTENTION_ENCODER_DECODER) uattn_write_cache(in, L, t, &job.cache, job.step_kv);
  if (working_units(&job) <= 1)
    uattn_runtime_run_alone(rt, attention_job, &job);
  else
    uattn_runtime_run(rt, attention_job, &job);
  if (sched->split_slot[sched->num_items] > 0) {
    atomic_store(&job.next_unit, 0);
    uattn_runtime_run(rt, merge_splits_job, &job);
  }
  uattn_runtime_release(rt, held);
  for (int p = 0; p < UATTN_NUM_PARTS; p++) {
    report->part_calls[p] = atomic_load(&job.part_calls[p]);
    report->decode_calls[p] = atomic_load(&job.decode_calls[p]);
  }
  report->workspace_bytes = job.scratch_bytes;
  report->workers = job.max_workers;
  return UATTN_OK;
}
