/* The vLLM batch utilities of uattn_vllm.h under bad input, through the suite's table runner (misuse.h). */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "misuse.h"
#include "uattn_vllm.h"

/* ---- vLLM batch utilities ----------------------------------------------------------------------------- */

/* Three requests: a decode, a decode and a prefill of 4 tokens. */
static const int32_t batch_qsl[] = {0, 1, 2, 6}, batch_seq_lens[] = {5, 3, 4};

typedef struct split_args {
  int32_t num_reqs, num_tokens, decode_threshold;
  const int32_t *query_start_loc, *seq_lens;
  uattn_batch_split *out;
  struct {
    uattn_batch_split out;
  } w;
} split_args;
static void split_init(void *p) {
  split_args *a = p;
  *a = (split_args){3, 6, 1, batch_qsl, batch_seq_lens, &a->w.out};
}
#define split_decodes_and_prefills_init split_init
#define split_decodes_prefills_and_extends_init split_init
static uattn_status split_decodes_and_prefills_call(void *p) {
  split_args *a = p;
  return uattn_split_decodes_and_prefills(a->num_reqs, a->query_start_loc, a->num_tokens, a->decode_threshold, false,
                                          a->out);
}
static uattn_status split_decodes_prefills_and_extends_call(void *p) {
  split_args *a = p;
  return uattn_split_decodes_prefills_and_extends(a->num_reqs, a->query_start_loc, a->seq_lens, a->num_tokens,
                                                  a->decode_threshold, a->out);
}

Test(api_misuse, uattn_split_decodes_and_prefills_and_extends) {
  typedef split_args T;
  static const api_fn two = API_FN(split_decodes_and_prefills, T),
                      three = API_FN(split_decodes_prefills_and_extends, T);
  static const misuse cases[] = {
      POINTER_ARG(T, query_start_loc, "query_start_loc"),
      NULL_ARG(T, out, "out"),
      LENGTH(T, num_reqs, UATTN_OK, "num_reqs"),
      COUNT(T, num_tokens, REFUSED, UATTN_OK, "num_tokens"),
      COUNT(T, decode_threshold, UATTN_OK, UATTN_OK, "decode_threshold"),
  };
  static const misuse extends_only[] = {POINTER_ARG(T, seq_lens, "seq_lens")};
  RUN(two, cases);
  RUN(three, cases);
  RUN(three, extends_only);
}

typedef struct reorder_args {
  int32_t num_reqs, decode_threshold, swaps_capacity;
  const int32_t *num_scheduled, *num_computed, *num_prompt; /* num_prompt: the four-region form only */
  int32_t scheduled[3], computed[3], prompt[3];
  uattn_swap *swaps;
  int32_t *num_swaps, *order;
  struct {
    uattn_swap swaps[4];
    int32_t num_swaps, order[4];
  } w;
} reorder_args;
static void reorder_init(void *p) {
  reorder_args *a = p;
  /* a prefill and two decodes, or with the prompt lengths a prefill, a short extend and a decode: one swap */
  *a = (reorder_args){.num_reqs = 3,
                      .decode_threshold = 1,
                      .swaps_capacity = 3,
                      .num_scheduled = a->scheduled,
                      .num_computed = a->computed,
                      .num_prompt = a->prompt,
                      .scheduled = {5, 1, 1},
                      .computed = {0, 4, 3},
                      .prompt = {5, 9, 3},
                      .swaps = a->w.swaps,
                      .num_swaps = &a->w.num_swaps,
                      .order = a->w.order};
}
static uattn_status reorder_call(void *p) {
  reorder_args *a = p;
  return uattn_reorder_batch_to_split_decodes_and_prefills(a->num_reqs, a->num_scheduled, a->num_computed,
                                                           a->decode_threshold, a->swaps, a->swaps_capacity,
                                                           a->num_swaps, a->order);
}
#define reorder4_init reorder_init
static uattn_status reorder4_call(void *p) {
  reorder_args *a = p;
  return uattn_reorder_batch_with_prompt_lens(a->num_reqs, a->num_scheduled, a->num_computed, a->num_prompt,
                                              a->decode_threshold, a->swaps, a->swaps_capacity, a->num_swaps, a->order);
}

/* The rows both reorders share. */
#define REORDER_MISUSE(T)                                                                                              \
  POINTER_ARG(T, num_scheduled, "num_scheduled"), POINTER_ARG(T, num_computed, "num_computed"),                        \
      POINTER_ARG(T, swaps, "swaps"), POINTER_ARG(T, num_swaps, "num_swaps"), MISALIGNED(T, order, "order"),           \
      LENGTH(T, num_reqs, UATTN_OK, "num_reqs"), COUNT(T, decode_threshold, UATTN_OK, UATTN_OK, "decode_threshold"),   \
      COUNT(T, swaps_capacity, REFUSED, UATTN_OK, "swaps")

Test(api_misuse, uattn_reorder_batch_to_split_decodes_and_prefills) {
  typedef reorder_args T;
  static const api_fn fn = API_FN(reorder, T);
  static const misuse cases[] = {REORDER_MISUSE(T)};
  RUN(fn, cases);
}

Test(api_misuse, uattn_reorder_batch_with_prompt_lens) {
  typedef reorder_args T;
  static const api_fn fn = API_FN(reorder4, T);
  static const misuse cases[] = {REORDER_MISUSE(T), POINTER_ARG(T, num_prompt, "num_prompt")};
  RUN(fn, cases);
}

/* Two requests cut into chunks of 8 keys over blocks of 4: 10 keys (3 new) and 12 keys (1 new). */
static const int32_t local_qsl[] = {0, 3, 4}, local_seq_lens[] = {10, 12}, local_table[] = {0, 1, 2, 3, 4, 5, 6, 7};

typedef struct local_args {
  int32_t attn_chunk_size, block_size, num_reqs, block_table_stride;
  const int32_t *query_start_loc, *seq_lens, *block_table;
  int32_t *num_batches, *pages_per_batch;
  uattn_local_batches out;
  struct {
    int32_t qsl[9], seq_lens[8], num_computed[8], table[8 * 2 + 1], req_indices[8], num_batches, pages;
  } w;
} local_args;
static void local_init(void *p) {
  local_args *a = p;
  *a = (local_args){8, 4, 2, 4, local_qsl, local_seq_lens, local_table, &a->w.num_batches, &a->w.pages};
  a->out = (uattn_local_batches){8, a->w.qsl, a->w.seq_lens, a->w.num_computed, a->w.table, a->w.req_indices};
}
#define count_local_init local_init
#define make_local_init local_init
static uattn_status count_local_call(void *p) {
  local_args *a = p;
  return uattn_count_local_attention_virtual_batches(a->attn_chunk_size, a->block_size, a->num_reqs, a->query_start_loc,
                                                     a->seq_lens, a->num_batches, a->pages_per_batch);
}
static uattn_status make_local_call(void *p) {
  local_args *a = p;
  return uattn_make_local_attention_virtual_batches(a->attn_chunk_size, a->block_size, a->num_reqs, a->query_start_loc,
                                                    a->seq_lens, a->block_table, a->block_table_stride, &a->out);
}
/* the out struct is the caller's request (capacity, arrays) as well as a result */
static int make_local_more(void *p, region *r) {
  local_args *a = p;
  r[0] = (region){&a->out, sizeof a->out, true};
  return 1;
}

Test(api_misuse, uattn_count_and_make_local_attention_virtual_batches) {
  typedef local_args T;
  static const api_fn count = API_FN(count_local, T), make = API_FN(make_local, T, .more = make_local_more);
  static const misuse cases[] = {
      POINTER_ARG(T, query_start_loc, "query_start_loc"),
      POINTER_ARG(T, seq_lens, "seq_lens"),
      COUNT(T, attn_chunk_size, REFUSED, REFUSED, "attn_chunk_size"),
      COUNT(T, block_size, REFUSED, REFUSED, "block_size"),
      LENGTH(T, num_reqs, UATTN_OK, "num_reqs"),
  };
  static const misuse count_only[] = {POINTER_ARG(T, num_batches, "num_batches"),
                                      POINTER_ARG(T, pages_per_batch, "pages_per_batch")};
  static const misuse make_only[] = {
      POINTER_ARG(T, block_table, "block_table"),
      MISALIGNED(T, out.query_start_loc, "query_start_loc"),
      MISALIGNED(T, out.seq_lens, "seq_lens"),
      MISALIGNED(T, out.num_computed, "num_computed"),
      MISALIGNED(T, out.block_table, "block_table"),
      MISALIGNED(T, out.req_indices, "req_indices"),
      LENGTH(T, block_table_stride, REFUSED, "block_table_stride"),
      COUNT(T, out.capacity, REFUSED, UATTN_OK, "capacity"),
  };
  RUN(count, cases);
  RUN(count, count_only);
  RUN(make, cases);
  RUN(make, make_only);
}

typedef struct slot_args {
  int32_t query_len, context_len, sliding_window, seq_len, start_idx, block_size, block_table_len, capacity;
  const int32_t *block_table;
  int32_t *start_out, *num_slots;
  int64_t *slot_mapping;
  struct {
    int64_t slots[17];
    int32_t start, num_slots;
  } w;
} slot_args;
static const int32_t slot_table[] = {3, 1, 2};
static void slot_init(void *p) {
  slot_args *a = p;
  *a = (slot_args){10, 0, 4, 10, 2, 4, 3, 16, slot_table, &a->w.start, &a->w.num_slots, a->w.slots};
}
#define slot_mapping_start_idx_init slot_init
#define slot_mapping_init slot_init
static uattn_status slot_mapping_start_idx_call(void *p) {
  slot_args *a = p;
  return uattn_compute_slot_mapping_start_idx(true, a->query_len, a->context_len, a->sliding_window, a->start_out);
}
static uattn_status slot_mapping_call(void *p) {
  slot_args *a = p;
  return uattn_compute_slot_mapping(false, a->seq_len, a->context_len, a->start_idx, a->block_size, a->block_table,
                                    a->block_table_len, a->slot_mapping, a->capacity, a->num_slots);
}

Test(api_misuse, uattn_compute_slot_mapping_and_start_idx) {
  typedef slot_args T;
  static const api_fn start = API_FN(slot_mapping_start_idx, T), slots = API_FN(slot_mapping, T);
  static const misuse start_cases[] = {
      POINTER_ARG(T, start_out, "start_idx"),
      COUNT(T, query_len, UATTN_OK, UATTN_OK, "query_len"),
      COUNT(T, context_len, UATTN_OK, UATTN_OK, "context_len"),
      COUNT(T, sliding_window, UATTN_OK, UATTN_OK, "sliding_window"),
  };
  static const misuse slot_cases[] = {
      POINTER_ARG(T, num_slots, "num_slots"),
      POINTER_ARG(T, slot_mapping, "slot_mapping"),
      POINTER_ARG(T, block_table, "block_table"),
      LENGTH(T, seq_len, REFUSED, "seq_len"),
      SET(T, seq_len, INT32_MAX, UATTN_ERR_CAPACITY, "capacity"),
      COUNT(T, context_len, UATTN_OK, REFUSED, "context_len"),
      COUNT(T, start_idx, UATTN_OK, REFUSED, "start_idx"),
      COUNT(T, block_size, REFUSED, UATTN_OK, "block_size"),
      SET(T, block_table_len, -1, REFUSED, "block_table_len"),
      SET(T, block_table_len, 0, UATTN_ERR_OUT_OF_RANGE, "block table"), /* position 9 needs entry 2 */
      COUNT(T, capacity, REFUSED, UATTN_OK, "capacity"),
  };
  RUN(start, start_cases);
  RUN(slots, slot_cases);
}

typedef struct chunks_args {
  int32_t num_reqs, workspace_size, request_offset, capacity;
  const int32_t *seq_lens;
  uattn_req_range *chunks;
  int32_t *num_chunks;
  struct {
    uattn_req_range chunks[4];
    int32_t num_chunks;
  } w;
} chunks_args;
static void chunks_init(void *p) {
  chunks_args *a = p;
  *a = (chunks_args){3, 8, 0, 3, batch_seq_lens, a->w.chunks, &a->w.num_chunks};
}
static uattn_status chunks_call(void *p) {
  chunks_args *a = p;
  return uattn_split_prefill_chunks(a->seq_lens, a->num_reqs, a->workspace_size, a->request_offset, a->chunks,
                                    a->capacity, a->num_chunks);
}

Test(api_misuse, uattn_split_prefill_chunks) {
  typedef chunks_args T;
  static const api_fn fn = API_FN(chunks, T);
  static const misuse cases[] = {
      POINTER_ARG(T, seq_lens, "seq_lens"),
      POINTER_ARG(T, chunks, "chunks"),
      POINTER_ARG(T, num_chunks, "num_chunks"),
      LENGTH(T, num_reqs, UATTN_OK, "num_reqs"),
      COUNT(T, workspace_size, REFUSED, UATTN_OK, "workspace_size"),
      COUNT(T, request_offset, UATTN_OK, REFUSED, "request_offset"),
      COUNT(T, capacity, REFUSED, UATTN_OK, "capacity"),
  };
  RUN(fn, cases);
}

typedef struct dcp_args {
  int32_t num_reqs, dcp_size, dcp_rank, interleave, capacity;
  const int32_t *seq_lens;
  int32_t *out;
  struct {
    int32_t out[9];
  } w;
} dcp_args;
static void dcp_init(void *p) {
  dcp_args *a = p;
  *a = (dcp_args){3, 2, -1, 1, 8, batch_seq_lens, a->w.out};
}
static uattn_status dcp_call(void *p) {
  dcp_args *a = p;
  return uattn_compute_dcp_local_seq_lens(a->seq_lens, a->num_reqs, a->dcp_size, a->dcp_rank, a->interleave, a->out,
                                          a->capacity);
}

Test(api_misuse, uattn_compute_dcp_local_seq_lens) {
  typedef dcp_args T;
  static const api_fn fn = API_FN(dcp, T);
  static const misuse cases[] = {
      POINTER_ARG(T, seq_lens, "seq_lens"),
      POINTER_ARG(T, out, "out"),
      LENGTH(T, num_reqs, UATTN_OK, "num_reqs"),
      SET(T, num_reqs, INT32_MAX, UATTN_ERR_OVERFLOW, "do not fit"), /* num_reqs x dcp_size values */
      LENGTH(T, dcp_size, REFUSED, "dcp_size"),
      SET(T, dcp_size, INT32_MAX, UATTN_ERR_OVERFLOW, "do not fit"),
      SET(T, dcp_rank, -2, REFUSED, "dcp_rank"),
      SET(T, dcp_rank, INT32_MAX, REFUSED, "dcp_rank"),
      COUNT(T, interleave, REFUSED, UATTN_OK, "interleave"),
      COUNT(T, capacity, REFUSED, UATTN_OK, "capacity"),
  };
  RUN(fn, cases);
}

typedef struct fast_prefill_args {
  int32_t num_reqs, num_logits;
  const int32_t *query_start_loc, *logits_indices;
  int32_t *query_start_loc_out;
  uattn_fast_prefill_info *info;
  struct {
    int32_t qsl_out[5];
    uattn_fast_prefill_info info;
  } w;
} fast_prefill_args;
static const int32_t fast_logits[] = {0, 1, 5};
static void fast_prefill_init(void *p) {
  fast_prefill_args *a = p;
  *a = (fast_prefill_args){3, 3, batch_qsl, fast_logits, a->w.qsl_out, &a->w.info};
}
static uattn_status fast_prefill_call(void *p) {
  fast_prefill_args *a = p;
  return uattn_make_kv_sharing_fast_prefill_metadata(a->num_reqs, a->query_start_loc, a->logits_indices, a->num_logits,
                                                     a->query_start_loc_out, a->info);
}

Test(api_misuse, uattn_make_kv_sharing_fast_prefill_metadata) {
  typedef fast_prefill_args T;
  static const api_fn fn = API_FN(fast_prefill, T);
  static const misuse cases[] = {
      POINTER_ARG(T, query_start_loc, "query_start_loc"),
      POINTER_ARG(T, logits_indices, "logits_indices"),
      POINTER_ARG(T, query_start_loc_out, "query_start_loc_out"),
      POINTER_ARG(T, info, "info"),
      SET(T, num_reqs, -1, REFUSED, "num_reqs"),
      SET(T, num_reqs, 0, UATTN_ERR_OUT_OF_RANGE, "query row"), /* no rows for the logits to index */
      LENGTH(T, num_logits, UATTN_OK, "num_logits"),
  };
  RUN(fn, cases);
}

typedef struct conv1d_args {
  int32_t num_reqs, block_m, capacity;
  const int32_t *query_start_loc;
  int32_t *num_programs, *padded_buffer_len, *programs_per_req, *batch_ptr, *token_chunk_offset_ptr;
  struct {
    int32_t num_programs, padded_buffer_len, programs_per_req[4], batch_ptr[9], offsets[9];
  } w;
} conv1d_args;
static void conv1d_init(void *p) {
  conv1d_args *a = p;
  *a = (conv1d_args){
      3,           2, 8, batch_qsl, &a->w.num_programs, &a->w.padded_buffer_len, a->w.programs_per_req, a->w.batch_ptr,
      a->w.offsets};
}
#define count_conv1d_init conv1d_init
#define conv1d_metadata_init conv1d_init
static uattn_status count_conv1d_call(void *p) {
  conv1d_args *a = p;
  return uattn_count_causal_conv1d_programs(a->query_start_loc, a->num_reqs, a->block_m, a->num_programs,
                                            a->padded_buffer_len);
}
static uattn_status conv1d_metadata_call(void *p) {
  conv1d_args *a = p;
  return uattn_compute_causal_conv1d_metadata(a->query_start_loc, a->num_reqs, a->block_m, a->programs_per_req,
                                              a->batch_ptr, a->token_chunk_offset_ptr, a->capacity, a->num_programs);
}

Test(api_misuse, uattn_causal_conv1d_programs_and_metadata) {
  typedef conv1d_args T;
  static const api_fn count = API_FN(count_conv1d, T), metadata = API_FN(conv1d_metadata, T);
  static const misuse cases[] = {
      POINTER_ARG(T, query_start_loc, "query_start_loc"),
      POINTER_ARG(T, num_programs, "num_programs"),
      LENGTH(T, num_reqs, UATTN_OK, "num_reqs"),
      COUNT(T, block_m, REFUSED, UATTN_OK, "block_m"),
  };
  static const misuse count_only[] = {MISALIGNED(T, padded_buffer_len, "padded_buffer_len")};
  static const misuse metadata_only[] = {
      POINTER_ARG(T, batch_ptr, "batch_ptr"), POINTER_ARG(T, token_chunk_offset_ptr, "token_chunk_offset_ptr"),
      MISALIGNED(T, programs_per_req, "programs_per_req"),
      LENGTH(T, capacity, REFUSED, "capacity"), /* all of the capacity is written: an array length */
  };
  RUN(count, cases);
  RUN(count, count_only);
  RUN(metadata, cases);
  RUN(metadata, metadata_only);
}

typedef struct query_kv_args {
  uattn_attention_type type;
  int32_t num_prefill_tokens, num_decode_tokens, num_encoder_tokens;
  uattn_query_kv_tokens *out;
  struct {
    uattn_query_kv_tokens out;
  } w;
} query_kv_args;
static void query_kv_init(void *p) {
  query_kv_args *a = p;
  *a = (query_kv_args){UATTN_ATTENTION_ENCODER_DECODER, 5, 2, 7, &a->w.out};
}
static uattn_status query_kv_call(void *p) {
  query_kv_args *a = p;
  return uattn_count_query_kv_tokens(a->type, a->num_prefill_tokens, a->num_decode_tokens, a->num_encoder_tokens,
                                     a->out);
}

Test(api_misuse, uattn_count_query_kv_tokens) {
  typedef query_kv_args T;
  static const api_fn fn = API_FN(query_kv, T);
  static const misuse cases[] = {
      POINTER_ARG(T, out, "out"),
      ENUM(T, type, "attention type"),
      COUNT(T, num_prefill_tokens, UATTN_OK, UATTN_OK, "num_prefill_tokens"),
      COUNT(T, num_decode_tokens, UATTN_OK, UATTN_OK, "num_decode_tokens"),
      SET(T, num_encoder_tokens, -1, REFUSED, "num_encoder_tokens"), /* unset: an error for encoder types */
      SET(T, num_encoder_tokens, -2, REFUSED, "num_encoder_tokens"),
      SET(T, num_encoder_tokens, 0, UATTN_OK, "num_encoder_tokens"),
      SET(T, num_encoder_tokens, INT32_MAX, UATTN_OK, "num_encoder_tokens"),
  };
  RUN(fn, cases);
}

typedef struct select_args {
  uattn_attention_metadata metadata;
  const uattn_attention_metadata *metadata_ptr;
  uattn_attention_type type;
  uattn_seq_len_block_table *out;
  struct {
    uattn_seq_len_block_table out;
  } w;
} select_args;
static void select_init(void *p) {
  select_args *a = p;
  a->metadata = (uattn_attention_metadata){batch_seq_lens, 5, 3, local_table, 4, batch_seq_lens, 5, local_table, 4};
  a->metadata_ptr = &a->metadata;
  a->type = UATTN_ATTENTION_DECODER;
  a->out = &a->w.out;
}
static uattn_status select_call(void *p) {
  select_args *a = p;
  return uattn_select_seq_len_block_table(a->metadata_ptr, true, a->type, a->out);
}

Test(api_misuse, uattn_select_seq_len_block_table) {
  typedef select_args T;
  static const api_fn fn = API_FN(select, T);
  static const misuse cases[] = {
      NULL_ARG(T, metadata_ptr, "metadata"),
      POINTER_ARG(T, out, "out"),
      POINTER_ARG(T, metadata.seq_lens, "seq_lens"),
      POINTER_ARG(T, metadata.block_tables, "block_tables"),
      ENUM(T, type, "attention type"),
      SET(T, metadata.max_prefill_seq_len, -1, REFUSED, "max_prefill_seq_len"),
      SET(T, metadata.block_tables_stride, -1, REFUSED, "stride"),
  };
  RUN(fn, cases);
}
