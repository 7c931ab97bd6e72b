/* libFuzzer target: the vLLM batch utilities (runtime/vllm/) with arguments decoded from the input.
 * The first byte picks the function. Inputs are exact-length heap arrays (ASan sees a read one past the
 * end), mostly well-formed (query_start_loc from 0 and rising), sometimes anything. Outputs are exact-length
 * heap buffers filled with a pattern: a refused call must leave every one of them as it was (uattn.h: "On
 * any error nothing is written to any output") and say why. Counts that size the caller's arrays are only
 * ever passed as the arrays' real lengths or as values the library must refuse on their own (negative),
 * since a larger count with shorter arrays is the caller's bug, which no library can see. */
#include <stdio.h>

#include "fuzz_input.h"
#include "uattn.h"
#include "uattn_vllm.h"

#define MAX_REQS 12
#define MAX_CAP 64

/* The outputs of one call, to check after a refusal. */
typedef struct outputs {
  void *ptr[8];
  size_t bytes[8];
  int n;
} outputs;

static void *output(outputs *o, size_t bytes) {
  void *p = fuzz_output(bytes);
  o->ptr[o->n] = p;
  o->bytes[o->n++] = bytes;
  return p;
}

static void check_refusal(const outputs *o, uattn_status st, const char *fn) {
  if (st == UATTN_OK) return;
  if (!uattn_last_error()[0]) {
    fprintf(stderr, "fuzz_batch_utils: %s refused (%s) without a message\n", fn, uattn_status_name(st));
    abort();
  }
  for (int i = 0; i < o->n; i++)
    if (!fuzz_untouched(o->ptr[i], o->bytes[i])) {
      fprintf(stderr, "fuzz_batch_utils: %s refused (%s: %s) but wrote output %d\n", fn, uattn_status_name(st),
              uattn_last_error(), i);
      abort();
    }
}

/* query_start_loc of n requests: from 0 and non-decreasing (queries of 0..8 tokens), or in one input in
 * eight arbitrary values, which the functions must refuse. */
static int32_t *decode_qsl(fuzz_input *in, int32_t n) {
  if (fuzz_u8(in) < 32) return fuzz_ints(in, n + 1, -2, 20);
  int32_t *q = fuzz_ints(in, n + 1, 0, 0);
  q[0] = 0;
  for (int32_t r = 0; r < n; r++) q[r + 1] = q[r] + fuzz_range(in, 0, 8);
  return q;
}

/* seq_lens at least each request's query length (num_computed 0..8 on top), or arbitrary. */
static int32_t *decode_seq_lens(fuzz_input *in, const int32_t *qsl, int32_t n) {
  if (fuzz_u8(in) < 32) return fuzz_ints(in, n, -1, 40);
  int32_t *s = fuzz_ints(in, n, 0, 0);
  for (int32_t r = 0; r < n; r++) {
    const int64_t len = (int64_t)qsl[r + 1] - qsl[r] + fuzz_range(in, 0, 8);
    s[r] = len < 0 ? 0 : len > INT32_MAX ? INT32_MAX : (int32_t)len;
  }
  return s;
}

/* The count passed for arrays of n entries: n, or a negative count. */
static int32_t count_arg(fuzz_input *in, int32_t n) { return fuzz_u8(in) < 16 ? fuzz_range(in, INT32_MIN, -1) : n; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_input in = {data, size, 0};
  const uint8_t fn = fuzz_u8(&in);
  const int32_t n = fuzz_range(&in, 0, MAX_REQS), num_reqs = count_arg(&in, n);
  int32_t cap = fuzz_range(&in, -1, MAX_CAP);
  const size_t cap_n = (size_t)(cap > 0 ? cap : 0);
  outputs o = {{0}, {0}, 0};
  int32_t *qsl = decode_qsl(&in, n), *seq_lens = decode_seq_lens(&in, qsl, n), *ints = NULL, *table = NULL;
  const uint8_t nulls = fuzz_u8(&in); /* a set bit passes NULL for that pointer */
  const int32_t *q_arg = nulls & 1 ? NULL : qsl, *s_arg = nulls & 2 ? NULL : seq_lens;
  uattn_status st = UATTN_OK;
  const char *name = "?";
  switch (fn % 14) {
  case 0: {
    name = "uattn_split_decodes_and_prefills";
    uattn_batch_split *out = nulls & 4 ? NULL : output(&o, sizeof *out);
    st = uattn_split_decodes_and_prefills(num_reqs, q_arg, fuzz_count(&in, 0, 80), fuzz_count(&in, 0, 8),
                                          fuzz_bool(&in), out);
    break;
  }
  case 1: {
    name = "uattn_split_decodes_prefills_and_extends";
    uattn_batch_split *out = nulls & 4 ? NULL : output(&o, sizeof *out);
    st = uattn_split_decodes_prefills_and_extends(num_reqs, q_arg, s_arg, fuzz_count(&in, 0, 80), fuzz_count(&in, 0, 8),
                                                  out);
    break;
  }
  case 2: {
    name = "uattn_reorder_batch_to_split_decodes_and_prefills";
    ints = fuzz_ints(&in, 2 * n, -1, 6); /* num_scheduled, then num_computed */
    uattn_swap *swaps = nulls & 4 ? NULL : output(&o, sizeof *swaps * cap_n);
    int32_t *num_swaps = nulls & 8 ? NULL : output(&o, sizeof *num_swaps);
    int32_t *order = nulls & 16 ? output(&o, sizeof *order * (size_t)n) : NULL;
    if (nulls & 32) { /* today's form: num_prompt too, NULL when bit 6 is set */
      name = "uattn_reorder_batch_with_prompt_lens";
      table = fuzz_ints(&in, n, -1, 6);
      st = uattn_reorder_batch_with_prompt_lens(num_reqs, nulls & 1 ? NULL : ints, nulls & 2 ? NULL : ints + n,
                                                nulls & 64 ? NULL : table, fuzz_count(&in, 0, 4), swaps, cap, num_swaps,
                                                order);
      break;
    }
    st = uattn_reorder_batch_to_split_decodes_and_prefills(num_reqs, nulls & 1 ? NULL : ints,
                                                           nulls & 2 ? NULL : ints + n, fuzz_count(&in, 0, 4), swaps,
                                                           cap, num_swaps, order);
    break;
  }
  case 3: {
    name = "uattn_count_local_attention_virtual_batches";
    int32_t *nb = nulls & 4 ? NULL : output(&o, sizeof *nb), *ppb = nulls & 8 ? NULL : output(&o, sizeof *ppb);
    st = uattn_count_local_attention_virtual_batches(fuzz_count(&in, 0, 16), fuzz_count(&in, 0, 8), num_reqs, q_arg,
                                                     s_arg, nb, ppb);
    break;
  }
  case 4: {
    name = "uattn_make_local_attention_virtual_batches";
    /* the caller sizes out->block_table by the pages of a virtual batch, chunk / bs: both stay small */
    const int32_t chunk = fuzz_size(&in, 0, 16), bs = fuzz_size(&in, 0, 8);
    const size_t pages = chunk > 0 && bs > 0 ? (size_t)(chunk / bs) : 0;
    const int32_t stride = fuzz_size(&in, 0, 6), cols = stride > 0 && stride <= 6 ? stride : 0;
    table = fuzz_ints(&in, n * cols, -1, 30);
    uattn_local_batches out;
    memset(&out, 0, sizeof out);
    out.capacity = cap;
    const uint8_t which = fuzz_u8(&in);
    if (which & 1) out.query_start_loc = output(&o, sizeof(int32_t) * (cap_n + 1));
    if (which & 2) out.seq_lens = output(&o, sizeof(int32_t) * cap_n);
    if (which & 4) out.num_computed = output(&o, sizeof(int32_t) * cap_n);
    if (which & 8) out.block_table = output(&o, sizeof(int32_t) * cap_n * pages);
    if (which & 16) out.req_indices = output(&o, sizeof(int32_t) * cap_n);
    const uattn_local_batches before = out;
    st = uattn_make_local_attention_virtual_batches(chunk, bs, num_reqs, q_arg, s_arg, nulls & 4 ? NULL : table, stride,
                                                    nulls & 8 ? NULL : &out);
    if (st != UATTN_OK && memcmp(&before, &out, sizeof out)) {
      fprintf(stderr, "fuzz_batch_utils: %s refused but changed *out\n", name);
      abort();
    }
    break;
  }
  case 5: {
    name = "uattn_compute_slot_mapping_start_idx";
    int32_t *start = nulls & 4 ? NULL : output(&o, sizeof *start);
    st = uattn_compute_slot_mapping_start_idx(fuzz_bool(&in), fuzz_count(&in, 0, 40), fuzz_count(&in, 0, 40),
                                              fuzz_count(&in, 0, 16), start);
    break;
  }
  case 6: {
    name = "uattn_compute_slot_mapping";
    const int32_t len = fuzz_range(&in, 0, 8);
    table = fuzz_ints(&in, len, -1, 20);
    int64_t *slots = nulls & 4 ? NULL : output(&o, sizeof *slots * cap_n);
    int32_t *num_slots = nulls & 8 ? NULL : output(&o, sizeof *num_slots);
    st = uattn_compute_slot_mapping(fuzz_bool(&in), fuzz_count(&in, 0, 40), fuzz_count(&in, 0, 40),
                                    fuzz_count(&in, 0, 40), fuzz_count(&in, 0, 8), nulls & 16 ? NULL : table,
                                    count_arg(&in, len), slots, cap, num_slots);
    break;
  }
  case 7: {
    name = "uattn_split_prefill_chunks";
    uattn_req_range *chunks = nulls & 4 ? NULL : output(&o, sizeof *chunks * cap_n);
    int32_t *num = nulls & 8 ? NULL : output(&o, sizeof *num);
    st = uattn_split_prefill_chunks(s_arg, num_reqs, fuzz_count(&in, 0, 40), fuzz_count(&in, 0, 8), chunks, cap, num);
    break;
  }
  case 8: {
    name = "uattn_compute_dcp_local_seq_lens";
    int32_t *out = nulls & 4 ? NULL : output(&o, sizeof *out * cap_n);
    st = uattn_compute_dcp_local_seq_lens(s_arg, num_reqs, fuzz_count(&in, 0, 6), fuzz_count(&in, -1, 6),
                                          fuzz_count(&in, 0, 6), out, cap);
    break;
  }
  case 9: {
    name = "uattn_make_kv_sharing_fast_prefill_metadata";
    const int32_t num_logits = fuzz_range(&in, 0, 16);
    ints = fuzz_ints(&in, num_logits, -1, 40);
    int32_t *qsl_out = nulls & 4 ? NULL : output(&o, sizeof *qsl_out * (size_t)(n + 1));
    uattn_fast_prefill_info *info = nulls & 8 ? NULL : output(&o, sizeof *info);
    st = uattn_make_kv_sharing_fast_prefill_metadata(num_reqs, q_arg, nulls & 16 ? NULL : ints,
                                                     count_arg(&in, num_logits), qsl_out, info);
    break;
  }
  case 10: {
    name = "uattn_count_causal_conv1d_programs";
    int32_t *programs = nulls & 4 ? NULL : output(&o, sizeof *programs),
            *len = nulls & 8 ? NULL : output(&o, sizeof *len);
    st = uattn_count_causal_conv1d_programs(q_arg, num_reqs, fuzz_count(&in, 0, 10), programs, len);
    break;
  }
  case 11: {
    name = "uattn_compute_causal_conv1d_metadata";
    int32_t *per_req = nulls & 4 ? output(&o, sizeof *per_req * (size_t)n) : NULL;
    int32_t *batch = nulls & 8 ? NULL : output(&o, sizeof *batch * cap_n);
    int32_t *offsets = nulls & 16 ? NULL : output(&o, sizeof *offsets * cap_n);
    int32_t *programs = nulls & 32 ? NULL : output(&o, sizeof *programs);
    st = uattn_compute_causal_conv1d_metadata(q_arg, num_reqs, fuzz_count(&in, 0, 10), per_req, batch, offsets, cap,
                                              programs);
    break;
  }
  case 12: {
    name = "uattn_count_query_kv_tokens";
    uattn_query_kv_tokens *out = nulls & 4 ? NULL : output(&o, sizeof *out);
    st = uattn_count_query_kv_tokens((uattn_attention_type)fuzz_range(&in, -1, 5), fuzz_count(&in, 0, 40),
                                     fuzz_count(&in, 0, 40), fuzz_count(&in, -1, 40), out);
    break;
  }
  default: {
    name = "uattn_select_seq_len_block_table";
    uattn_attention_metadata m;
    memset(&m, 0, sizeof m);
    m.seq_lens = nulls & 8 ? NULL : seq_lens;
    m.max_prefill_seq_len = fuzz_count(&in, -1, 40);
    m.max_decode_seq_len = fuzz_count(&in, -1, 40);
    m.block_tables = nulls & 16 ? NULL : qsl;
    m.block_tables_stride = fuzz_count(&in, -1, 4);
    m.encoder_seq_lens = nulls & 32 ? NULL : seq_lens;
    m.max_encoder_seq_len = fuzz_count(&in, -1, 40);
    m.cross_block_tables = nulls & 64 ? NULL : qsl;
    m.cross_block_tables_stride = fuzz_count(&in, -1, 4);
    uattn_seq_len_block_table *out = nulls & 4 ? NULL : output(&o, sizeof *out);
    st = uattn_select_seq_len_block_table(nulls & 128 ? NULL : &m, fuzz_bool(&in),
                                          (uattn_attention_type)fuzz_range(&in, -1, 5), out);
    break;
  }
  }
  check_refusal(&o, st, name);
  for (int i = 0; i < o.n; i++) free(o.ptr[i]);
  free(qsl), free(seq_lens), free(ints), free(table);
  return 0;
}
