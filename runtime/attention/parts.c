/* The parts of a tile's attention and the kernel calls that compute them: the seed's decomposition
 * (unified.py), computed per (work item, KV head, query tile) over only the pairs that are visible, with
 * masks derived from positions and per-row usages rather than bias tensors. The causal part takes a prompt's
 * rows against this step's keys of the same request, as the cache holds them; the shared part context blocks
 * read by several rows (processed whole, or chunk_size blocks at a time and merged with an online softmax as
 * in PR 784); the unique part context blocks read by one row, reduced per row; the cross part an encoder's
 * keys. units.c merges them with the seed's merge. The two seed defects are fixed by the plan: a decode
 * row's keys all come from the cache, usages are per row. Each part writes only its tile's partial states. */
#include <string.h>

#include "attention/forward_internal.h"

/* Context parallelism (uattn.h: uattn_plan_config.cp_size > 1): the rank's cache holds its share of every
 * request at local positions, the plan's context lengths and block starts count local keys, and this step's
 * keys the rank holds are gathered as the causal part reads them (consecutive local positions, so it stays one
 * panel at a time). The kernels place key i at key_pos0 + i; a row's causal and window bounds are monotone
 * in the local position, so they are given in local terms: visible counts of local keys, and for a window
 * each row's query position moved to where the kernel's window test (key > query - window) cuts the local
 * keys where the global one does (units.c: local_query_pos). ALiBi needs the true distance between a key and
 * the query, which local positions do not give: with ALiBi every kernel call takes only a run of keys at
 * consecutive global positions (at most cp_interleave of them), at its global position, with the global
 * query positions (pieces; the decode kernel and all-heads units are not used then). Sinks are rank 0's. */

/* The parts stay functions of their own (never inlined, even by a link-time optimizer), so a profile without
 * debug information still says which part the time went to (perf/record/record.sh). */
#define PART_FN __attribute__((noinline))

/* The kernel entry (uattn_part) that attends into an accumulator. */
static uattn_part kernel_part(int acc) {
  return acc == ACC_CAUSAL ? UATTN_PART_CAUSAL : acc == ACC_UNIQUE ? UATTN_PART_UNIQUE : UATTN_PART_SHARED;
}

/* Where a row of the tile keeps its query, states and visible count in the workspace: the tile's rows in
 * order, from slot 0 or, in an all-heads unit, from KV head g's slot g * rows. */
static int32_t tile_slot(const step_ctx *c, int32_t row) { return row - c->row0 + c->slot; }

/* The kernel job of rows [row_lo, row_hi) of the tile against num_keys keys at key_pos0, into `acc`. */
static uattn_panel_job panel_job(const step_ctx *c, int acc, int32_t row_lo, int32_t row_hi, int32_t num_keys,
                                 int32_t key_pos0) {
  const workspace *w = c->w;
  const int32_t D = c->dim, first = tile_slot(c, row_lo);
  const size_t idx = state_index(w, acc, first, 0);
  const uattn_panel_job job = {
      .rows = row_hi - row_lo,
      .group = w->group,
      .head_dim = D,
      .q = w->q + (size_t)first * w->group * D,
      .query_pos = c->cp && !c->pieces ? w->query_pos + first : c->in->token_positions + row_lo,
      .visible = w->visible + first,
      .num_keys = num_keys,
      .key_pos0 = key_pos0,
      .keys = w->keys,
      .values = w->values,
      .soft_cap = c->L->soft_cap,
      .window = c->L->attn_type == UATTN_ATTENTION_DECODER ? c->L->sliding_window : 0,
      .alibi = c->L->alibi_slopes ? c->L->alibi_slopes + c->kv_head * w->group : NULL,
      .m = w->state_m + idx,
      .l = w->state_l + idx,
      .o = w->state_o + idx * D,
      .scores = w->scores,
      .scale = cache_score_scale(c->L), /* fp8: the folded k_scale, in every part */
      .probs_fp32 = c->L->probs_fp32,
      .value_dim = layer_dims(c->L).v, /* out's dims: a latent's first head_dim_v, an expanded form's own */
  };
  return job;
}

/* A kernel call over rows [row_lo, row_hi) of the tile (their visible counts already in w->visible) and the
 * panel now loaded, into `acc`. */
static void attend_panel(const step_ctx *c, int acc, int32_t row_lo, int32_t row_hi, int32_t num_keys,
                         int32_t key_pos0) {
  const uattn_panel_job job = panel_job(c, acc, row_lo, row_hi, num_keys, key_pos0);
  const uattn_part kp = kernel_part(acc);
  c->w->calls[kp]++;
  c->w->kern->attend[kp](&job, c->w->panel);
}

/* NHD and HND: where a cache block's keys for the tile's KV head start (bytes into each cache) and the
 * elements from one key to the next: a whole row of heads in NHD, one head in HND. */
static size_t block_source(const step_ctx *c, int32_t block, size_t *stride) {
  *stride =
      c->cache.layout == UATTN_LAYOUT_NHD ? (size_t)c->cache.kv_heads * c->cache.head_dim : (size_t)c->cache.head_dim;
  return cache_offset(&c->cache, (int64_t)block * c->cache.block_size, c->kv_head) * uattn_dtype_size(c->cache.dtype);
}

/* TILED: where a cache block's first tile holds the tile's KV head (bytes into each cache), and the elements
 * from one tile's share of that head to the next tile's. */
static size_t tiled_source(const step_ctx *c, int32_t block, size_t *tile_stride) {
  *tile_stride = (size_t)c->cache.kv_heads * UATTN_TILED_KEYS * c->cache.head_dim;
  return tiled_share(&c->cache, block, 0, c->kv_head) * uattn_dtype_size(c->cache.dtype);
}

/* Widens `count` keys and values of a cache block, from its key `first` on, for the tile's KV head into the
 * panels: on TILED, from the block as it lies where the set can (kernels.h: load_tiled); staged into rows
 * (uattn_stage_block) on TILED otherwise and where value rows are another length than key rows; else from the
 * cache's rows. */
static void load_block(const step_ctx *c, int32_t block, int32_t first, int32_t count) {
  if (c->w->use.load_tiled) {
    size_t stride;
    const size_t off = tiled_source(c, block, &stride);
    c->w->kern->load_tiled(c->cache.dtype, c->cache.k + off, c->cache.v + off, stride, first, count, c->cache.head_dim,
                           c->w->panel, c->w->keys, c->w->values);
    return;
  }
  if (c->cache.layout == UATTN_LAYOUT_TILED || c->w->use.staged) {
    const size_t half = (size_t)c->in->block_size * c->dim * uattn_dtype_size(c->cache.dtype);
    uattn_stage_block(&c->cache, block, first, count, c->kv_head, 1, c->dim, c->w->stage, c->w->stage + half);
    c->w->kern->load(c->cache.dtype, c->w->stage, c->w->stage + half, (size_t)c->dim, count, c->dim, c->w->panel,
                     c->w->keys, c->w->values);
    return;
  }
  size_t stride;
  const size_t off = block_source(c, block, &stride) + (size_t)first * stride * uattn_dtype_size(c->cache.dtype);
  c->w->kern->load(c->cache.dtype, c->cache.k + off, c->cache.v + off, stride, count, c->cache.head_dim, c->w->panel,
                   c->w->keys, c->w->values);
}

/* ALiBi under context parallelism (above): the first `count` keys of a block, cut into runs of
 * consecutive global positions, each loaded and attended at its global position, every row seeing of a run
 * what it sees of the block (its visible count of the block, kept in piece_from). */
static void attend_block_pieces(const step_ctx *c, int acc, int32_t row_lo, int32_t row_hi, int32_t block,
                                int32_t block_start, int32_t count) {
  const int32_t I = c->cp->cp_interleave;
  int32_t seen = 0; /* keys of the block any of the rows sees */
  for (int32_t row = row_lo; row < row_hi; row++) {
    const int32_t x = tile_slot(c, row);
    c->w->piece_from[x] = c->w->visible[x];
    if (c->w->visible[x] > seen) seen = c->w->visible[x];
  }
  if (seen > count) seen = count;
  for (int32_t a = 0, b; a < seen; a = b) {
    b = a + I - (block_start + a) % I;
    if (b > seen) b = seen;
    for (int32_t row = row_lo; row < row_hi; row++) {
      const int32_t x = tile_slot(c, row), v = c->w->piece_from[x] - a;
      c->w->visible[x] = v < 0 ? 0 : (v > b - a ? b - a : v);
    }
    load_block(c, block, a, b - a);
    attend_panel(c, acc, row_lo, row_hi, b - a, uattn_cp_global_pos(c->cp, block_start + a));
  }
}

/* Attends the tile's rows in [row_lo, row_hi) (their visible counts already in w->visible) to the first
 * `count` keys of a cache block, into `acc`. */
static void attend_block(const step_ctx *c, int acc, int32_t row_lo, int32_t row_hi, int32_t block, int32_t block_start,
                         int32_t count) {
  if (c->pieces) {
    attend_block_pieces(c, acc, row_lo, row_hi, block, block_start, count);
    return;
  }
  load_block(c, block, 0, count);
  attend_panel(c, acc, row_lo, row_hi, c->in->block_size, block_start);
}

/* Attends the tile's rows in [row_lo, row_hi) to the first `count` keys of a cache block, each row seeing
 * usage(row) of them, into `acc`. */
static void attend_rows(const step_ctx *c, int acc, int32_t row_lo, int32_t row_hi, int32_t block, int32_t block_start,
                        int32_t count, int32_t (*usage)(const step_ctx *, int32_t row, int32_t block_start)) {
  if (row_lo < c->row0) row_lo = c->row0;
  if (row_hi > c->row0 + c->rows) row_hi = c->row0 + c->rows;
  if (row_lo >= row_hi) return;
  for (int32_t row = row_lo; row < row_hi; row++) c->w->visible[tile_slot(c, row)] = usage(c, row, block_start);
  attend_block(c, acc, row_lo, row_hi, block, block_start, count);
}

/* Keys of a context block a row sees: decoder rows by their own context length (per-row usage);
 * bidirectional rows see every cached key. */
static int32_t context_usage(const step_ctx *c, int32_t row, int32_t block_start) {
  const int32_t len = c->L->attn_type == UATTN_ATTENTION_DECODER ? c->in->token_context_lens[row] : c->num_computed;
  const int32_t u = len - block_start;
  return u < 0 ? 0 : (u > c->in->block_size ? c->in->block_size : u);
}

/* The causal part under context parallelism, over this step's keys of the request in rows [qs, key_end)
 * of k/v: those the rank holds, gathered a panel at a time (in pieces also cut where their positions jump)
 * and placed at their local positions (in pieces their global ones). */
static void causal_part_cp(const step_ctx *c, int32_t key_end) {
  const uattn_layer *L = c->L;
  const bool decoder = L->attn_type == UATTN_ATTENTION_DECODER;
  const int32_t D = c->dim, Hkv = L->num_kv_heads, nc = c->in->token_positions[c->qs];
  const size_t esz = uattn_dtype_size(c->step_dtype), row_bytes = (size_t)D * esz;
  char *gk = (char *)c->w->gather, *gv = gk + (size_t)c->w->panel * row_bytes;
  int32_t local = c->num_computed; /* the local position of the next key the rank holds */
  for (int32_t k = c->qs; k < key_end;) {
    int32_t n = 0, pos0 = 0;
    for (; k < key_end && n < c->w->panel; k++) {
      const int32_t pos = nc + (k - c->qs);
      if (!uattn_cp_owns(c->cp, pos)) {
        if (c->pieces && n > 0) break;
        continue;
      }
      if (n == 0) pos0 = pos;
      const size_t off = ((size_t)k * Hkv + c->kv_head) * row_bytes;
      memcpy(gk + (size_t)n * row_bytes, c->step_k + off, row_bytes);
      memcpy(gv + (size_t)n * row_bytes, c->step_v + off, row_bytes);
      n++;
    }
    if (n == 0) continue;
    c->w->kern->load(c->step_dtype, gk, gv, (size_t)D, n, D, c->w->panel, c->w->keys, c->w->values);
    const int32_t key_pos0 = c->pieces ? pos0 : local;
    for (int32_t row = c->row0; row < c->row0 + c->rows; row++) {
      const int32_t pos = c->in->token_positions[row];
      /* a decoder row sees the keys at or before its position */
      const int32_t hi = !decoder ? n : c->pieces ? pos + 1 - key_pos0 : uattn_cp_local_len(c->cp, pos + 1) - local;
      c->w->visible[tile_slot(c, row)] = hi < 0 ? 0 : (hi > n ? n : hi);
    }
    attend_panel(c, ACC_CAUSAL, c->row0, c->row0 + c->rows, n, key_pos0);
    local += n;
  }
}

PART_FN void uattn_causal_part(const step_ctx *c) {
  const uattn_layer *L = c->L;
  const bool decoder = L->attn_type == UATTN_ATTENTION_DECODER;
  if (!uattn_reads_step_keys(c->in, L, c->req)) return; /* a decode row's keys are all in the cache */
  const int32_t D = c->dim, Hkv = L->num_kv_heads;
  const size_t esz = uattn_dtype_size(c->step_dtype);
  /* keys: this step's rows of the request; a decoder tile needs those up to its last row */
  const int32_t key_end = decoder ? c->row0 + c->rows : c->qe;
  if (c->cp) {
    causal_part_cp(c, key_end);
    return;
  }
  for (int32_t k0 = c->qs; k0 < key_end; k0 += c->w->panel) {
    const int32_t n = key_end - k0 < c->w->panel ? key_end - k0 : c->w->panel;
    const size_t off = ((size_t)k0 * Hkv + c->kv_head) * D * esz;
    c->w->kern->load(c->step_dtype, c->step_k + off, c->step_v + off, (size_t)Hkv * D, n, D, c->w->panel, c->w->keys,
                     c->w->values);
    for (int32_t row = c->row0; row < c->row0 + c->rows; row++) {
      const int32_t hi = decoder ? row + 1 - k0 : n; /* a decoder row sees this step's keys up to its own */
      c->w->visible[tile_slot(c, row)] = hi < 0 ? 0 : (hi > n ? n : hi);
    }
    attend_panel(c, ACC_CAUSAL, c->row0, c->row0 + c->rows, n, c->num_computed + (k0 - c->qs));
  }
}

/* Folds the chunk scratch into the shared part and clears it (PR 784's online merge across chunks). */
static void merge_chunk(const step_ctx *c) {
  const int32_t D = c->dim;
  for (int32_t i = 0; i < c->rows; i++)
    for (int32_t h = 0; h < c->w->group; h++) {
      const int32_t x = c->slot + i;
      uattn_state a = acc_state(c->w, ACC_SHARED, x, h, D), b = acc_state(c->w, ACC_CHUNK, x, h, D);
      uattn_state_merge(&a, &b, D);
      store_state(c->w, ACC_SHARED, x, h, &a);
      uattn_state_reset(&b, D);
      store_state(c->w, ACC_CHUNK, x, h, &b);
    }
}

/* Each of rows [row_lo, row_hi) of the tile sees of a run of `blocks` blocks from block_start the whole of
 * all but the last: into w->visible (the first head's slots: every head's rows see the same keys). Returns
 * the most any of them sees. */
static int32_t run_visible(const step_ctx *c, int32_t row_lo, int32_t row_hi, int32_t block_start, int32_t blocks) {
  const int32_t bs = c->in->block_size;
  int32_t most = 0;
  for (int32_t row = row_lo; row < row_hi; row++) {
    const int32_t u = (blocks - 1) * bs + context_usage(c, row, block_start + (blocks - 1) * bs);
    c->w->visible[tile_slot(c, row)] = u;
    if (u > most) most = u;
  }
  return most;
}

/* Whether a panel run of m blocks from position first_start takes the block at block_start too (unique_panel_run,
 * shared_part): the next position, within the unit's keys and the workspace's panel, and not in pieces (ALiBi
 * under context parallelism loads a block's keys in runs of their own). A run is as many blocks as fill the panel
 * where the decode kernel does not serve them, so that a kernel call's fixed cost (its queries rounded, its
 * outputs read and written) is paid once for them; which blocks go together depends on the block table alone. */
static bool joins_panel_run(const step_ctx *c, int32_t first_start, int32_t m, int32_t block_start) {
  const int32_t bs = c->in->block_size;
  return !c->pieces && m < UATTN_DECODE_MAX_BLOCKS && (m + 1) * bs <= c->w->panel &&
         block_start == first_start + m * bs && block_start < c->key_hi;
}

/* Widens a run of m cache blocks (joins_panel_run) for the tile's KV head into the panels, staged one after another
 * into rows (uattn_stage_block). */
static void load_run(const step_ctx *c, const int32_t *ids, int32_t m) {
  const int32_t bs = c->in->block_size;
  const size_t esz = uattn_dtype_size(c->cache.dtype), rows_bytes = (size_t)bs * c->dim * esz;
  const size_t half = (size_t)c->w->panel * c->dim * esz;
  for (int32_t b = 0; b < m; b++)
    uattn_stage_block(&c->cache, ids[b], 0, bs, c->kv_head, 1, c->dim, c->w->stage + b * rows_bytes,
                      c->w->stage + half + b * rows_bytes);
  c->w->kern->load(c->cache.dtype, c->w->stage, c->w->stage + half, (size_t)c->dim, m * bs, c->dim, c->w->panel,
                   c->w->keys, c->w->values);
}

/* Attends the tile's rows in [row_lo, row_hi) to a run of m cache blocks at consecutive positions from
 * block_start (joins_panel_run), each row seeing all but the last whole, into `acc`: one block as attend_rows
 * does, several staged one after another into rows (uattn_stage_block), loaded into one panel and attended. */
static void attend_run(const step_ctx *c, int acc, int32_t row_lo, int32_t row_hi, const int32_t *ids, int32_t m,
                       int32_t block_start) {
  if (m == 1) {
    attend_rows(c, acc, row_lo, row_hi, ids[0], block_start, c->in->block_size, context_usage);
    return;
  }
  if (row_lo < c->row0) row_lo = c->row0;
  if (row_hi > c->row0 + c->rows) row_hi = c->row0 + c->rows;
  if (row_lo >= row_hi) return;
  run_visible(c, row_lo, row_hi, block_start, m);
  load_run(c, ids, m);
  attend_panel(c, acc, row_lo, row_hi, m * c->in->block_size, block_start);
}

/* Whether the tile's rows in [row_lo, row_hi) see the whole block at block_start. */
static bool rows_see_whole(const step_ctx *c, int32_t row_lo, int32_t row_hi, int32_t block_start) {
  if (row_lo < c->row0) row_lo = c->row0;
  if (row_hi > c->row0 + c->rows) row_hi = c->row0 + c->rows;
  for (int32_t row = row_lo; row < row_hi; row++)
    if (context_usage(c, row, block_start) != c->in->block_size) return false;
  return true;
}

/* The shared part's panel runs (joins_panel_run): the request's spans from its k-th (spans_by_req order, up to
 * end) of the same rows at the next positions, in one chunk (chunk_size), which the rows see whole but for the
 * last; their cache blocks into ids. */
static int32_t shared_panel_run(const step_ctx *c, int32_t k, int32_t end, int32_t *ids) {
  const uattn_shared_span *spans = c->in->shared_spans;
  const int32_t *order = c->sched->spans_by_req, chunk = c->L->chunk_size, bs = c->in->block_size;
  const uattn_shared_span *a = &spans[order[k]];
  int32_t m = 1;
  ids[0] = c->in->shared_blocks[a->shared_index];
  for (; k + m < end; m++) {
    const uattn_shared_span *b = &spans[order[k + m]];
    if (b->token_begin != a->token_begin || b->token_end != a->token_end ||
        (chunk > 0 && b->shared_index / chunk != a->shared_index / chunk) ||
        !joins_panel_run(c, a->block_start, m, b->block_start) ||
        !rows_see_whole(c, a->token_begin, a->token_end, b->block_start - bs))
      break;
    ids[m] = c->in->shared_blocks[b->shared_index];
  }
  return m;
}

PART_FN void uattn_shared_part(const step_ctx *c) {
  const uattn_plan_info *in = c->in;
  const int32_t chunk = c->L->chunk_size;
  const int acc = chunk > 0 ? ACC_CHUNK : ACC_SHARED;
  int32_t current_chunk = -1;
  const int32_t *order = c->sched->spans_by_req, end = c->sched->span_req_begin[c->req + 1];
  for (int32_t k = c->sched->span_req_begin[c->req]; k < end; k++) {
    const uattn_shared_span *sp = &in->shared_spans[order[k]];
    if (sp->token_end <= c->row0 || sp->token_begin >= c->row0 + c->rows) continue;
    if (sp->block_start < c->key_lo || sp->block_start >= c->key_hi) continue;
    if (chunk > 0 && sp->shared_index / chunk != current_chunk) {
      if (current_chunk >= 0) merge_chunk(c);
      current_chunk = sp->shared_index / chunk;
    }
    int32_t ids[UATTN_DECODE_MAX_BLOCKS];
    const int32_t blocks = shared_panel_run(c, k, end, ids);
    attend_run(c, acc, sp->token_begin, sp->token_end, ids, blocks, sp->block_start);
    k += blocks - 1;
  }
  if (current_chunk >= 0) merge_chunk(c);
}

/* A prefix run's panel run (uattn_shared_part_prefix_run): m blocks from position start, read by the tile's rows
 * [lo, hi), each seeing vis[i] of them (tile row i; 0: it reads none) and last[i] of the last. */
typedef struct prefix_panel_run {
  int32_t ids[UATTN_DECODE_MAX_BLOCKS];
  int32_t m, start, lo, hi, chunk;
  int32_t vis[UATTN_PREFIX_RUN_MAX_ROWS], last[UATTN_PREFIX_RUN_MAX_ROWS];
} prefix_panel_run;

/* Whether the block at block_start, which the tile's rows [lo, hi) read use[i] keys of, joins the run: the next
 * position in the same chunk (joins_panel_run), read by the same rows, each of which saw the run's last block
 * whole. */
static bool joins_prefix_run(const step_ctx *c, const prefix_panel_run *p, int32_t block_start, int32_t chunk,
                             int32_t lo, int32_t hi, const int32_t *use) {
  if (p->m == 0 || chunk != p->chunk || lo != p->lo || hi != p->hi || !joins_panel_run(c, p->start, p->m, block_start))
    return false;
  for (int32_t i = 0; i < c->rows; i++)
    if ((use[i] > 0) != (p->last[i] > 0) || (p->last[i] > 0 && p->last[i] != c->in->block_size)) return false;
  return true;
}

/* Attends the run's rows to its blocks (one as it lies, several through the stage) and empties it. */
static void flush_prefix_run(const step_ctx *c, int acc, prefix_panel_run *p) {
  if (p->m == 0) return;
  for (int32_t i = 0; i < c->rows; i++) c->w->visible[c->slot + i] = p->vis[i];
  if (p->m == 1) {
    attend_block(c, acc, p->lo, p->hi, p->ids[0], p->start, c->in->block_size);
  } else {
    load_run(c, p->ids, p->m);
    attend_panel(c, acc, p->lo, p->hi, p->m * c->in->block_size, p->start);
  }
  p->m = 0;
}

/* The shared part of a prefix run (requests [first, end), consecutive, all reading the cache only):
 * their span lists merged by shared block, so each block is loaded once for every row of the tile that
 * reads it, and blocks that the same rows read at consecutive positions go a panel at a time (joins_prefix_run).
 * A row that does not read a block sees none of it (visible 0). */
PART_FN void uattn_shared_part_prefix_run(const step_ctx *c, int32_t first, int32_t end) {
  const uattn_plan_info *in = c->in;
  const int32_t chunk = c->L->chunk_size, *order = c->sched->spans_by_req, *begin = c->sched->span_req_begin;
  const int acc = chunk > 0 ? ACC_CHUNK : ACC_SHARED;
  int32_t cursor[UATTN_PREFIX_RUN_MAX_ROWS]; /* each request's next span (a run has at most that many) */
  for (int32_t r = first; r < end; r++) cursor[r - first] = begin[r];
  int32_t current_chunk = -1;
  prefix_panel_run run = {.m = 0};
  for (;;) {
    int32_t next = INT32_MAX; /* the lowest shared block any request has left */
    for (int32_t r = first; r < end; r++)
      if (cursor[r - first] < begin[r + 1] && in->shared_spans[order[cursor[r - first]]].shared_index < next)
        next = in->shared_spans[order[cursor[r - first]]].shared_index;
    if (next == INT32_MAX) break;
    int32_t lo = INT32_MAX, hi = INT32_MIN, block_start = 0; /* the tile's rows that read it */
    int32_t use[UATTN_PREFIX_RUN_MAX_ROWS] = {0};
    for (int32_t r = first; r < end; r++) {
      if (cursor[r - first] >= begin[r + 1]) continue;
      const uattn_shared_span *sp = &in->shared_spans[order[cursor[r - first]]];
      if (sp->shared_index != next) continue;
      cursor[r - first]++;
      const int32_t a = sp->token_begin > c->row0 ? sp->token_begin : c->row0;
      const int32_t b = sp->token_end < c->row0 + c->rows ? sp->token_end : c->row0 + c->rows;
      if (a >= b) continue;
      block_start = sp->block_start; /* the same in every request that holds the block */
      for (int32_t row = a; row < b; row++) use[row - c->row0] = context_usage(c, row, block_start);
      if (a < lo) lo = a;
      if (b > hi) hi = b;
    }
    if (lo >= hi) continue;
    const int32_t block_chunk = chunk > 0 ? next / chunk : -1;
    if (!joins_prefix_run(c, &run, block_start, block_chunk, lo, hi, use)) {
      flush_prefix_run(c, acc, &run);
      if (chunk > 0 && block_chunk != current_chunk) {
        if (current_chunk >= 0) merge_chunk(c);
        current_chunk = block_chunk;
      }
      run = (prefix_panel_run){.m = 0, .start = block_start, .lo = lo, .hi = hi, .chunk = block_chunk};
    }
    run.ids[run.m++] = in->shared_blocks[next];
    for (int32_t i = 0; i < c->rows; i++) run.vis[i] += use[i], run.last[i] = use[i];
  }
  flush_prefix_run(c, acc, &run);
  if (current_chunk >= 0) merge_chunk(c);
}

/* A decode row's unique block straight from the cache, when the kernel set can (kernels.h: decode) and the
 * keys of a block are at consecutive positions (not in pieces). */
static bool decodes_from_cache(const step_ctx *c) { return !c->pieces && c->w->use.decode; }

/* The decode kernel on rows [row_lo, row_hi) of the tile (their visible counts already in w->visible) and
 * the first n keys of a run of `count` cache blocks at consecutive positions from block_start (unique_run,
 * shared_run: several on NHD and HND, one on TILED), into `acc`, for `heads` KV heads from the tile's (an
 * all-heads unit's heads, their slots `rows` apart); next_block (-1: none) is the block the unit reads next,
 * whose first keys the kernel asks for as it ends (uattn_panel_job.next_k). The layout picks the call:
 *  - NHD: one call for every head, whose keys lie a head dim apart in each row, read in address order;
 *  - HND: one call a head, head after head over the head's piece of each block, each told the next head's
 *    rows (the last the next block's first), since one call for every head would put every head's rows in
 *    the same L1 sets;
 *  - TILED: one call on the block as it lies where the set can (kernels.h: decode_tiled), else on its rows
 *    staged as an NHD cache of these heads holds them, as on every layout whose value rows are another length
 *    than its key rows (uattn_kernel_use.staged). */
static void decode_call(const step_ctx *c, int acc, int32_t row_lo, int32_t row_hi, const int32_t *blocks,
                        int32_t count, int32_t block_start, int32_t n, int32_t heads, int32_t next_block) {
  uattn_panel_job job = panel_job(c, acc, row_lo, row_hi, n, block_start);
  job.q = c->w->q_decode + (job.q - c->w->q); /* the queries as the decode kernels take them */
  const size_t head_vectors = (size_t)c->rows * c->w->group, D = (size_t)c->cache.head_dim;
  const size_t esz = uattn_dtype_size(c->cache.dtype);
  const int32_t block = blocks[0];
  c->w->calls[kernel_part(acc)] += heads;
  c->w->decode_calls[kernel_part(acc)] += heads;
  if (c->cache.layout == UATTN_LAYOUT_HND && !c->w->use.staged) {
    const void *k[UATTN_DECODE_MAX_BLOCKS], *v[UATTN_DECODE_MAX_BLOCKS];
    const uattn_decode_src src = uattn_decode_blocks(c->w->kern, k, v, count, c->in->block_size, D, 0);
    for (int32_t g = 0; g < heads; g++) {
      uattn_panel_job h = uattn_decode_head_job(&job, g, head_vectors);
      for (int32_t b = 0; b < count; b++) {
        const size_t at = cache_offset(&c->cache, (int64_t)blocks[b] * c->cache.block_size, c->kv_head + g) * esz;
        k[b] = c->cache.k + at, v[b] = c->cache.v + at;
      }
      if (g + 1 < heads || next_block >= 0) { /* the next head's rows, or the next block's first head's */
        const int64_t slot = (int64_t)(g + 1 < heads ? block : next_block) * c->cache.block_size;
        const size_t to = cache_offset(&c->cache, slot, g + 1 < heads ? c->kv_head + g + 1 : c->kv_head) * esz;
        h.next_k = c->cache.k + to, h.next_v = c->cache.v + to;
      }
      c->w->kern->decode(&h, 1, head_vectors, c->cache.dtype, &src, c->w->decode_scratch);
    }
  } else if (c->cache.layout == UATTN_LAYOUT_NHD && !c->w->use.staged) {
    size_t stride = 0;
    const void *k[UATTN_DECODE_MAX_BLOCKS], *v[UATTN_DECODE_MAX_BLOCKS];
    for (int32_t b = 0; b < count; b++) {
      const size_t at = block_source(c, blocks[b], &stride);
      k[b] = c->cache.k + at, v[b] = c->cache.v + at;
    }
    if (next_block >= 0) {
      const size_t next = block_source(c, next_block, &stride);
      job.next_k = c->cache.k + next, job.next_v = c->cache.v + next;
    }
    const uattn_decode_src src = uattn_decode_blocks(c->w->kern, k, v, count, c->in->block_size, stride, D);
    c->w->kern->decode(&job, heads, head_vectors, c->cache.dtype, &src, c->w->decode_scratch);
  } else if (c->w->use.decode_tiled) {
    size_t stride;
    const size_t off = tiled_source(c, block, &stride);
    if (next_block >= 0) {
      const size_t next = tiled_source(c, next_block, &stride);
      job.next_k = c->cache.k + next, job.next_v = c->cache.v + next;
    }
    c->w->kern->decode_tiled(&job, heads, head_vectors, c->cache.dtype, c->cache.k + off, c->cache.v + off, stride,
                             UATTN_TILED_KEYS * D, c->w->decode_scratch);
  } else {
    const size_t W = (size_t)c->dim, half = (size_t)n * heads * W * esz;
    uattn_stage_block(&c->cache, block, 0, n, c->kv_head, heads, c->dim, c->w->stage, c->w->stage + half);
    const void *k = c->w->stage, *v = c->w->stage + half;
    const uattn_decode_src src = uattn_decode_one_block(&k, &v, (size_t)heads * W, W);
    c->w->kern->decode(&job, heads, head_vectors, c->cache.dtype, &src, c->w->decode_scratch);
  }
}

/* The cache block of the row's unique block after k where the unit reads it, else -1 (decode_call's
 * next_block). */
static int32_t next_unique_block(const step_ctx *c, int32_t row, int32_t k) {
  if (k + 1 >= c->sched->unique_row_begin[row + 1]) return -1;
  const uattn_unique_block *u = &c->in->unique_blocks[k + 1];
  return u->block_start >= c->key_lo && u->block_start < c->key_hi ? u->block : -1;
}

/* Whether a decode call that takes m blocks, from position first_start in cache block first, takes cache block
 * `block` at block_start too (unique_run, shared_run): the next position, within the unit's keys, the set's
 * decode_max_keys (uattn_kernel_caps) and UATTN_DECODE_MAX_BLOCKS (kernels.h: no set's list holds more; runs of
 * smaller NHD blocks stop there), on a cache whose rows the decode kernel reads from a list of blocks (NHD,
 * HND; uattn_decode_list_fits), or, at other block sizes, the next block of an NHD cache (a run of adjacent
 * blocks is one stretch of rows: uattn_decode_blocks); never on staged rows, staged a block at a time. */
static bool joins_decode_call(const step_ctx *c, int32_t first_start, int32_t first, int32_t m, int32_t block_start,
                              int32_t block) {
  const int32_t bs = c->in->block_size;
  const bool rows = c->cache.layout != UATTN_LAYOUT_TILED && !c->w->use.staged; /* read where they lie */
  const bool list = rows && uattn_decode_list_fits(c->w->kern, bs);
  const bool run = rows && c->cache.layout == UATTN_LAYOUT_NHD && block == first + m;
  return (list || run) && m < UATTN_DECODE_MAX_BLOCKS && (m + 1) * bs <= c->w->kern->caps.decode_max_keys &&
         block_start == first_start + m * bs && block_start < c->key_hi;
}

/* How many of the row's unique blocks from its k-th one decode call takes (joins_decode_call): those the row
 * sees whole but for the last, wherever they lie in the cache (at block sizes that take no list, adjacent NHD
 * blocks), up to the set's decode_max_keys keys, so that the decode kernel's fixed cost a call (the vectors put
 * into its order and back, each vector's softmax steps) is paid once for them. Which blocks go together
 * depends on the block table alone, so the answer does not depend on the threads. Their cache blocks into ids
 * (UATTN_DECODE_MAX_BLOCKS). */
static int32_t unique_run(const step_ctx *c, int32_t row, int32_t k, int32_t *ids) {
  const uattn_unique_block *u = c->in->unique_blocks;
  const int32_t bs = c->in->block_size, end = c->sched->unique_row_begin[row + 1];
  int32_t m = 1;
  ids[0] = u[k].block;
  while (k + m < end && joins_decode_call(c, u[k].block_start, u[k].block, m, u[k + m].block_start, u[k + m].block) &&
         context_usage(c, row, u[k + m].block_start - bs) == bs)
    ids[m] = u[k + m].block, m++;
  return m;
}

/* unique_run for the request's shared spans from its k-th (spans_by_req order, up to end): spans of the same
 * rows at the next positions, which the tile's rows [row_lo, row_hi) see whole but for the last; their cache
 * blocks into ids. */
static int32_t shared_run(const step_ctx *c, int32_t k, int32_t end, int32_t row_lo, int32_t row_hi, int32_t *ids) {
  const uattn_shared_span *spans = c->in->shared_spans;
  const int32_t *order = c->sched->spans_by_req, *blocks = c->in->shared_blocks, bs = c->in->block_size;
  const uattn_shared_span *a = &spans[order[k]];
  int32_t m = 1;
  ids[0] = blocks[a->shared_index];
  for (; k + m < end; m++) {
    const uattn_shared_span *b = &spans[order[k + m]];
    if (b->token_begin != a->token_begin || b->token_end != a->token_end ||
        !joins_decode_call(c, a->block_start, ids[0], m, b->block_start, blocks[b->shared_index]))
      break;
    bool whole = true;
    for (int32_t row = row_lo; row < row_hi && whole; row++) whole = context_usage(c, row, b->block_start - bs) == bs;
    if (!whole) break;
    ids[m] = blocks[b->shared_index];
  }
  return m;
}

/* The unique part's panel runs (joins_panel_run): the row's unique blocks from its k-th, which it sees whole but
 * for the last; their cache blocks into ids. */
static int32_t unique_panel_run(const step_ctx *c, int32_t row, int32_t k, int32_t *ids) {
  const uattn_unique_block *u = c->in->unique_blocks;
  const int32_t bs = c->in->block_size, end = c->sched->unique_row_begin[row + 1];
  int32_t m = 1;
  ids[0] = u[k].block;
  while (k + m < end && joins_panel_run(c, u[k].block_start, m, u[k + m].block_start) &&
         context_usage(c, row, u[k + m].block_start - bs) == bs)
    ids[m] = u[k + m].block, m++;
  return m;
}

PART_FN void uattn_unique_part(const step_ctx *c) {
  const uattn_plan_info *in = c->in;
  const bool direct = decodes_from_cache(c);
  for (int32_t row = c->row0; row < c->row0 + c->rows; row++)
    for (int32_t k = c->sched->unique_row_begin[row]; k < c->sched->unique_row_begin[row + 1]; k++) {
      const uattn_unique_block *u = &in->unique_blocks[k];
      if (u->block_start < c->key_lo || u->block_start >= c->key_hi) continue;
      if (!direct) {
        int32_t ids[UATTN_DECODE_MAX_BLOCKS];
        const int32_t blocks = unique_panel_run(c, row, k, ids);
        attend_run(c, ACC_UNIQUE, row, row + 1, ids, blocks, u->block_start);
        k += blocks - 1;
        continue;
      }
      int32_t ids[UATTN_DECODE_MAX_BLOCKS];
      const int32_t blocks = unique_run(c, row, k, ids);
      run_visible(c, row, row + 1, u->block_start, blocks);
      decode_call(c, ACC_UNIQUE, row, row + 1, ids, blocks, u->block_start, blocks * in->block_size, 1,
                  next_unique_block(c, row, k + blocks - 1));
      k += blocks - 1;
    }
}

/* The shared and unique parts of an all-heads unit (c: its first KV head's tile, c->heads its heads): each
 * run of blocks in one decode call for the unit's heads (decode_call), which reads the blocks' rows in the
 * cache's order; a verification's shared blocks go through the decode kernel as its unique ones do. */
PART_FN void uattn_shared_part_all_heads(const step_ctx *c) {
  const uattn_plan_info *in = c->in;
  const int32_t *order = c->sched->spans_by_req, end = c->sched->span_req_begin[c->req + 1];
  for (int32_t k = c->sched->span_req_begin[c->req]; k < end; k++) {
    const uattn_shared_span *sp = &in->shared_spans[order[k]];
    if (sp->block_start < c->key_lo || sp->block_start >= c->key_hi) continue;
    const int32_t row_lo = sp->token_begin > c->row0 ? sp->token_begin : c->row0,
                  row_hi = sp->token_end < c->row0 + c->rows ? sp->token_end : c->row0 + c->rows;
    int32_t ids[UATTN_DECODE_MAX_BLOCKS];
    const int32_t blocks = shared_run(c, k, end, row_lo, row_hi, ids);
    const uattn_shared_span *next = k + blocks < end ? &in->shared_spans[order[k + blocks]] : NULL;
    const bool ahead = next && next->block_start >= c->key_lo && next->block_start < c->key_hi;
    const int32_t keys = run_visible(c, row_lo, row_hi, sp->block_start, blocks);
    if (keys > 0)
      decode_call(c, ACC_SHARED, row_lo, row_hi, ids, blocks, sp->block_start, keys, c->heads,
                  ahead ? in->shared_blocks[next->shared_index] : -1);
    k += blocks - 1;
  }
}

PART_FN void uattn_unique_part_all_heads(const step_ctx *c) {
  const uattn_plan_info *in = c->in;
  for (int32_t row = c->row0; row < c->row0 + c->rows; row++)
    for (int32_t k = c->sched->unique_row_begin[row]; k < c->sched->unique_row_begin[row + 1]; k++) {
      const uattn_unique_block *u = &in->unique_blocks[k];
      if (u->block_start < c->key_lo || u->block_start >= c->key_hi) continue;
      int32_t ids[UATTN_DECODE_MAX_BLOCKS];
      const int32_t blocks = unique_run(c, row, k, ids);
      const int32_t keys = run_visible(c, row, row + 1, u->block_start, blocks);
      if (keys > 0)
        decode_call(c, ACC_UNIQUE, row, row + 1, ids, blocks, u->block_start, keys, c->heads,
                    next_unique_block(c, row, k + blocks - 1));
      k += blocks - 1;
    }
}

/* The encoder keys of the tile's request in the caches: all of them, or with context parallelism the
 * rank's share (uattn.h: encoder_lens are global, the cross block table the rank's own). */
static int32_t encoder_keys(const step_ctx *c) {
  const int32_t len = c->t->cross->encoder_lens[c->req];
  return c->cp ? uattn_cp_local_len(c->cp, len) : len;
}

static int32_t cross_usage(const step_ctx *c, int32_t row, int32_t block_start) {
  (void)row;
  const int32_t u = encoder_keys(c) - block_start;
  return u > c->in->block_size ? c->in->block_size : u;
}

/* Cross attention: every encoder key, through the cross block table, into the shared part. */
PART_FN void uattn_cross_part(const step_ctx *c) {
  const uattn_cross *x = c->t->cross;
  const int32_t bs = c->in->block_size, len = encoder_keys(c);
  for (int32_t b = 0; b * bs < len; b++) {
    const int32_t block = x->block_table[(int64_t)c->req * x->block_table_stride + b];
    attend_rows(c, ACC_SHARED, c->row0, c->row0 + c->rows, block, b * bs, len - b * bs < bs ? len - b * bs : bs,
                cross_usage);
  }
}
