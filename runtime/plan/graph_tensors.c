/* Graph tensors: the padded, dense metadata a static-shape graph engine takes (as the Gaudi plugin's HPU
 * graphs do), built on request.
 *
 * uattn's own kernels never read these (masks come from positions and usages); they exist for engines that
 * feed such kernels and for parity checks against the seed. They follow uattn's semantics: a decode
 * row gets nothing from the causal bias and usages are per token (docs/design.md, the seed's two defects).
 */
#include <math.h>
#include <string.h>

#include "plan/planner.h"

void uattn_graph_buffers_release(uattn_plan *p) {
  uattn_graph_buffers *b = &p->graph;
  uattn_buf *all[] = {&b->causal_bias,  &b->shared_bias, &b->shared_usage,    &b->unique_bias,   &b->unique_mapping,
                      &b->slot_mapping, &b->token_ids,   &b->token_positions, &b->logits_indices};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) uattn_buf_release(&p->alloc, all[i]);
}

/* rows * cols * elem bytes into *bytes, false on size_t overflow. */
static bool tensor_bytes(int64_t rows, int64_t cols, size_t elem, size_t *bytes) {
  if (rows < 0 || cols < 0) return false;
  if (cols != 0 && (uint64_t)rows > SIZE_MAX / elem / (uint64_t)cols) return false;
  *bytes = (size_t)rows * (size_t)cols * elem;
  return true;
}

static void fill_f32(float *x, size_t n, float v) {
  for (size_t i = 0; i < n; i++) x[i] = v;
}

static void fill_i32(int32_t *x, size_t n, int32_t v) {
  for (size_t i = 0; i < n; i++) x[i] = v;
}

/* The keys of a shared block that row t sees. */
static int32_t span_usage(const uattn_plan_info *in, const uattn_shared_span *sp, int32_t t) {
  int32_t u = in->token_context_lens[t] - sp->block_start;
  return u < 0 ? 0 : (u > in->block_size ? in->block_size : u);
}

static void build_causal_bias(const uattn_plan_info *in, int32_t tq, float *bias) {
  fill_f32(bias, (size_t)tq * tq, -INFINITY);
  for (int32_t r = 0; r < in->num_reqs; r++) {
    if (!in->is_prompt[r]) continue; /* a decode row's keys are all in the cache */
    for (int32_t i = in->query_start_loc[r]; i < in->query_start_loc[r + 1]; i++)
      for (int32_t j = in->query_start_loc[r]; j <= i; j++) bias[(size_t)i * tq + j] = 0.0f;
  }
}

static void build_shared(const uattn_plan_info *in, int32_t tq, int32_t ts, float *bias, int32_t *usage) {
  const int32_t bs = in->block_size;
  if (bias) fill_f32(bias, (size_t)tq * ts * bs, -INFINITY);
  if (usage) fill_i32(usage, (size_t)tq * ts, 0);
  for (int32_t k = 0; k < in->num_shared_spans; k++) {
    const uattn_shared_span *sp = &in->shared_spans[k];
    for (int32_t t = sp->token_begin; t < sp->token_end; t++) {
      const int32_t u = span_usage(in, sp, t);
      if (usage) usage[(size_t)t * ts + sp->shared_index] = u;
      if (bias) fill_f32(bias + ((size_t)t * ts + sp->shared_index) * bs, (size_t)u, 0.0f);
    }
  }
}

static void build_unique(const uattn_plan_info *in, int32_t tu, float *bias, int32_t *mapping) {
  const int32_t bs = in->block_size;
  fill_f32(bias, (size_t)tu * bs, -INFINITY);
  fill_i32(mapping, (size_t)tu, -1);
  for (int32_t k = 0; k < in->num_unique_blocks; k++) {
    const uattn_unique_block *u = &in->unique_blocks[k];
    fill_f32(bias + (size_t)u->block * bs, (size_t)u->usage, 0.0f);
    mapping[u->block] = u->token;
  }
}

static void build_padded_ids(const uattn_plan_info *in, const uattn_bucket *shape, uattn_graph_buffers *b) {
  int64_t *slots = b->slot_mapping.data;
  int32_t *ids = b->token_ids.data, *pos = b->token_positions.data, *logits = b->logits_indices.data;
  for (int32_t t = 0; t < shape->query_len; t++) {
    const bool real = t < in->num_tokens;
    slots[t] = real ? in->slot_mapping[t] : -1;
    ids[t] = real && in->token_ids ? in->token_ids[t] : -1;
    pos[t] = real ? in->token_positions[t] : -1;
  }
  for (int32_t i = 0; i < shape->logits; i++) logits[i] = i < in->num_logits ? in->logits_indices[i] : -1;
}

uattn_status uattn_plan_materialize(uattn_plan *p, unsigned what, uattn_graph_tensors *out) {
  uattn_clear_error();
  UATTN_CHECK_PTR(p, "plan");
  UATTN_CHECK_PTR(out, "out");
  const unsigned known = UATTN_GRAPH_CAUSAL_BIAS | UATTN_GRAPH_SHARED_BIAS | UATTN_GRAPH_SHARED_USAGE |
                         UATTN_GRAPH_UNIQUE_BIAS | UATTN_GRAPH_PADDED_IDS;
  if (what & ~known)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "materialize: unknown tensor flags 0x%x", what & ~known);
  const uattn_plan_info *in = &p->info;
  const uattn_bucket shape = in->padded;
  const int32_t bs = p->config.block_size;
  uattn_graph_buffers *b = &p->graph;

  /* sizes first, and every refusal before anything is built */
  size_t causal_bytes = 0, bias_bytes = 0, usage_bytes = 0, ubias_bytes = 0, umap_bytes = 0;
  bool ok = tensor_bytes(shape.query_len, shape.query_len, sizeof(float), &causal_bytes) &&
            tensor_bytes((int64_t)shape.query_len * shape.shared_blocks, bs, sizeof(float), &bias_bytes) &&
            tensor_bytes(shape.query_len, shape.shared_blocks, sizeof(int32_t), &usage_bytes) &&
            tensor_bytes(shape.unique_blocks, bs, sizeof(float), &ubias_bytes) &&
            tensor_bytes(shape.unique_blocks, 1, sizeof(int32_t), &umap_bytes);
  if (!ok) return uattn_fail(UATTN_ERR_OVERFLOW, "materialize: a tensor of the padded bucket overflows size_t");
  if ((what & UATTN_GRAPH_SHARED_BIAS) && bias_bytes > p->config.shared_bias_byte_limit)
    return uattn_fail(UATTN_ERR_TOO_LARGE,
                      "materialize: the shared bias [%d, %d, %d] needs %zu bytes, over the plan's "
                      "shared_bias_byte_limit of %zu; use the dense usage table (UATTN_GRAPH_SHARED_USAGE) or "
                      "chunked shared attention instead, or raise the limit",
                      shape.query_len, shape.shared_blocks, bs, bias_bytes, p->config.shared_bias_byte_limit);

  uattn_status st = UATTN_OK;
  if (!st && (what & UATTN_GRAPH_CAUSAL_BIAS)) st = uattn_buf_reserve(&p->alloc, &b->causal_bias, causal_bytes);
  if (!st && (what & UATTN_GRAPH_SHARED_BIAS)) st = uattn_buf_reserve(&p->alloc, &b->shared_bias, bias_bytes);
  if (!st && (what & UATTN_GRAPH_SHARED_USAGE)) st = uattn_buf_reserve(&p->alloc, &b->shared_usage, usage_bytes);
  if (!st && (what & UATTN_GRAPH_UNIQUE_BIAS)) st = uattn_buf_reserve(&p->alloc, &b->unique_bias, ubias_bytes);
  if (!st && (what & UATTN_GRAPH_UNIQUE_BIAS)) st = uattn_buf_reserve(&p->alloc, &b->unique_mapping, umap_bytes);
  if (!st && (what & UATTN_GRAPH_PADDED_IDS)) {
    const size_t tq = (size_t)shape.query_len, tl = (size_t)shape.logits;
    if (!(st = uattn_buf_reserve(&p->alloc, &b->slot_mapping, tq * sizeof(int64_t))) &&
        !(st = uattn_buf_reserve(&p->alloc, &b->token_ids, tq * sizeof(int32_t))) &&
        !(st = uattn_buf_reserve(&p->alloc, &b->token_positions, tq * sizeof(int32_t))))
      st = uattn_buf_reserve(&p->alloc, &b->logits_indices, tl * sizeof(int32_t));
  }
  if (st) return st;

  memset(out, 0, sizeof *out);
  out->shape = shape;
  if (what & UATTN_GRAPH_CAUSAL_BIAS) {
    build_causal_bias(in, shape.query_len, b->causal_bias.data);
    out->causal_bias = b->causal_bias.data;
  }
  if (what & (UATTN_GRAPH_SHARED_BIAS | UATTN_GRAPH_SHARED_USAGE)) {
    float *bias = (what & UATTN_GRAPH_SHARED_BIAS) ? b->shared_bias.data : NULL;
    int32_t *usage = (what & UATTN_GRAPH_SHARED_USAGE) ? b->shared_usage.data : NULL;
    build_shared(in, shape.query_len, shape.shared_blocks, bias, usage);
    out->shared_bias = bias;
    out->shared_usage = usage;
  }
  if (what & UATTN_GRAPH_UNIQUE_BIAS) {
    build_unique(in, shape.unique_blocks, b->unique_bias.data, b->unique_mapping.data);
    out->unique_bias = b->unique_bias.data;
    out->unique_block_mapping = b->unique_mapping.data;
  }
  if (what & UATTN_GRAPH_PADDED_IDS) {
    build_padded_ids(in, &shape, b);
    out->slot_mapping = b->slot_mapping.data;
    out->token_ids = b->token_ids.data;
    out->token_positions = b->token_positions.data;
    out->logits_indices = b->logits_indices.data;
  }
  return UATTN_OK;
}
