/* A worker's scratch for one forward call: its shape (the query tile, the key panels, the decode kernel's and
 * a TILED cache's staging room, context parallelism's gathers) from the layer and the kernel set, its size,
 * and its carving out of the memory the runtime keeps per worker. How the set is used (all-heads units, the
 * decode kernel on a TILED cache) comes with the kernel choice (kernel_choice.c: kernel_use). */
#include "attention/forward_internal.h"

#define UATTN_MAX_CAUSAL_WIDTH 512 /* the Gaudi plugin's query rows per causal slice */

/* Rows of a request an all-heads unit takes (units.c: run_all_heads): as many as the set's decode jobs hold. */
int32_t uattn_all_heads_max_rows(const uattn_kernels *set, const uattn_layer *L) {
  return set->caps.decode_max_vectors / (L->num_q_heads / L->num_kv_heads);
}

/* Query rows per tile where the layer leaves causal_width at 0: the seed's 512 on 8 KV heads or more, 64 a
 * KV head below, so that a prompt on few KV heads (a unit is a tile on one KV head) is work for several
 * workers and a tile's queries and states stay nearer the core's L2. */
static int32_t default_query_tile(const uattn_layer *L) {
  const int32_t tile = 64 * L->num_kv_heads;
  return tile < UATTN_MAX_CAUSAL_WIDTH ? tile : UATTN_MAX_CAUSAL_WIDTH;
}

void uattn_workspace_shape(workspace *w, const uattn_plan_info *in, const uattn_layer *L,
                           const uattn_kernel_choice *choice, bool cp) {
  const uattn_kernels *k = choice->set;
  w->kern = k;
  w->use = choice->use;
  w->tile = L->causal_width > 0 ? L->causal_width : default_query_tile(L);
  if (w->tile > in->num_tokens && in->num_tokens > 0) w->tile = in->num_tokens;
  w->slots = w->tile;
  if (w->use.all_heads && L->num_kv_heads * uattn_all_heads_max_rows(k, L) > w->slots)
    w->slots = L->num_kv_heads * uattn_all_heads_max_rows(k, L);
  w->panel = w->tile > in->block_size ? w->tile : in->block_size;
  /* without the decode kernel, a row's unique blocks go a panel at a time (parts.c: unique_panel_run): one of a
   * decode call's keys at least, so that a call's fixed cost is spread over as many */
  if (!w->use.decode && w->panel < UATTN_DECODE_MAX_KEYS) w->panel = UATTN_DECODE_MAX_KEYS;
  w->group = L->num_q_heads / L->num_kv_heads;
  const int32_t D = layer_dims(L).kernel;
  w->panel_floats = k->panel_floats(w->panel, D);
  w->decode_floats = 0;
  if (w->use.decode) {
    const bool all = w->use.all_heads;
    w->decode_floats = uattn_decode_scratch_floats(all ? L->num_kv_heads : 1,
                                                   all ? uattn_all_heads_max_rows(k, L) * w->group : w->group, D);
    w->decode_floats = (w->decode_floats + 15) & ~(size_t)15; /* what follows stays on 64-byte lines */
  }
  w->cp_floats = cp ? 2 * (size_t)w->panel * D + 2 * (size_t)w->slots : 0;
  /* staged rows (TILED, or values of another length): a block of one head for the panel loads; of every head
   * for a decode kernel that reads rows */
  w->stage_floats = 0;
  size_t bytes = 0;
  if (L->kv_layout == UATTN_LAYOUT_TILED || w->use.staged) {
    const bool all_rows = w->use.all_heads && !w->use.decode_tiled;
    bytes = 2 * (size_t)in->block_size * (all_rows ? L->num_kv_heads : 1) * D * uattn_dtype_size(L->cache_dtype);
  }
  const size_t run_bytes = 2 * (size_t)w->panel * D * uattn_dtype_size(L->cache_dtype);
  if (in->block_size < w->panel && run_bytes > bytes) /* a panel's run of blocks, staged (parts.c: attend_run) */
    bytes = run_bytes;
  if (bytes) w->stage_floats = ((bytes + 3) / 4 + 15) & ~(size_t)15;
}

/* Whether the decode kernels take the queries otherwise scaled than the attend (workspace.q_decode). */
static bool own_decode_queries(const workspace *w) {
  return w->use.decode && w->kern->caps.decode_unscaled_q != w->kern->caps.unscaled_q;
}

size_t uattn_workspace_bytes(const workspace *w, int32_t D) {
  const size_t tg = (size_t)w->slots * w->group;
  return sizeof(float) * (w->decode_floats + w->stage_floats + (own_decode_queries(w) ? 2 : 1) * tg * D +
                          2 * w->panel_floats + w->panel + NUM_ACCS * tg * D + NUM_ACCS * tg * 2 + w->cp_floats) +
         sizeof(int32_t) * (size_t)w->slots;
}

void uattn_workspace_carve(workspace *w, void *memory, int32_t D) {
  const size_t tg = (size_t)w->slots * w->group;
  float *f = memory;
  w->decode_scratch = f, f += w->decode_floats;
  w->stage = w->stage_floats ? (char *)f : NULL, f += w->stage_floats;
  w->q = f, f += tg * D;
  w->q_decode = own_decode_queries(w) ? f : w->q, f += own_decode_queries(w) ? tg * D : 0;
  w->keys = f, f += w->panel_floats;
  w->values = f, f += w->panel_floats;
  w->scores = f, f += w->panel;
  w->state_o = f, f += NUM_ACCS * tg * D;
  w->state_m = f, f += NUM_ACCS * tg;
  w->state_l = f, f += NUM_ACCS * tg;
  w->gather = w->cp_floats ? f : NULL, f += w->cp_floats ? 2 * (size_t)w->panel * D : 0;
  w->query_pos = w->cp_floats ? (int32_t *)f : NULL, f += w->cp_floats ? w->slots : 0;
  w->piece_from = w->cp_floats ? (int32_t *)f : NULL, f += w->cp_floats ? w->slots : 0;
  w->visible = (int32_t *)f;
}
