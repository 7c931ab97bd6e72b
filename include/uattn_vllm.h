/* uattn's re-creations of vLLM's attention-backend batch utilities (uattn.h has the core: plan, forward, runtime). */
#ifndef UATTN_VLLM_H
#define UATTN_VLLM_H

#include "uattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------------ */
/* vLLM attention-backend batch utilities                                                           */
/* ------------------------------------------------------------------------------------------------ */
/*
 * Re-creations, in C, of vLLM's batch helpers (vllm/v1/attention/backends/utils.py and the v0
 * vllm/attention/backends/utils.py). Each names vLLM function it re-creates; vLLM's results are
 * kept exactly, quirks included (each is noted), except that where vLLM asserts or crashes on bad
 * input these return an error status.
 *
 * Common to all of them:
 *  - query_start_loc ("qsl") has num_reqs + 1 entries, starts at 0 and never decreases: request r owns
 *    query rows [qsl[r], qsl[r+1]). Its query length is qsl[r+1] - qsl[r].
 *  - Outputs go to caller buffers. An output whose length is not fixed by the inputs comes with a capacity;
 *    when it is too small the call fails with UATTN_ERR_CAPACITY and the message gives the size needed.
 *    On any error nothing is written to any output.
 *  - Nothing here allocates.
 */

/* The slot of a token whose K/V must not be written (vLLM's PAD_SLOT_ID). */
#define UATTN_PAD_SLOT_ID (-1)

/* How many requests and query tokens are decodes, extends and prefills. */
typedef struct uattn_batch_split {
  int32_t num_decodes;
  int32_t num_extends; /* always 0 from uattn_split_decodes_and_prefills */
  int32_t num_prefills;
  int32_t num_decode_tokens;
  int32_t num_extend_tokens;
  int32_t num_prefill_tokens;
} uattn_batch_split;

/* vLLM's split_decodes_and_prefills: in a batch already reordered decodes first, the decodes are the
 * requests before the first one with more than decode_threshold (>= 0) query tokens; the rest are prefills.
 * With require_uniform, a decode must also have the first request's query length (0-length requests
 * count as padding when every other request has that length), so the first request of another length
 * starts the prefills. num_tokens is vLLM's num_actual_tokens: qsl[num_reqs], or more when the batch
 * is padded; prefill tokens are num_tokens - qsl[num_decodes]. num_reqs == 0 gives all zeros except
 * num_decode_tokens = num_tokens. A uniform batch whose num_tokens != num_reqs * first query length (vLLM's
 * assertion) is UATTN_ERR_INCONSISTENT. */
UATTN_API uattn_status uattn_split_decodes_and_prefills(int32_t num_reqs, const int32_t *query_start_loc,
                                                        int32_t num_tokens, int32_t decode_threshold,
                                                        bool require_uniform, uattn_batch_split *out);

/* vLLM's split_decodes_prefills_and_extends: like uattn_split_decodes_and_prefills (no uniform
 * option), then among the non-decodes, the prefills start at the first request with more than
 * decode_threshold query tokens and no context (seq_lens[r] == its query length); the ones before it are
 * extends. seq_lens: [num_reqs], each >= the request's query length. A short (<= decode_threshold) prompt
 * after the first extend counts as an extend, as in vLLM. */
UATTN_API uattn_status uattn_split_decodes_prefills_and_extends(int32_t num_reqs, const int32_t *query_start_loc,
                                                                const int32_t *seq_lens, int32_t num_tokens,
                                                                int32_t decode_threshold, uattn_batch_split *out);

/* Exchange the requests at positions a and b. */
typedef struct uattn_swap {
  int32_t a;
  int32_t b;
} uattn_swap;

/* vLLM's reorder_batch_to_split_decodes_and_prefills: the swaps that put the batch in decode ->
 * extend -> prefill order, where a prefill has num_computed == 0 (whatever its length), a decode has
 * num_computed > 0 and num_scheduled <= decode_threshold, and an extend is the rest. Applying swaps[0],
 * swaps[1], ... in turn to the batch orders it. Their number is the fewest any sequence of swaps can do
 * (vLLM's own sequence is sometimes longer), and at most max(num_reqs - 1, 0), so a capacity of
 * num_reqs always suffices. *num_swaps == 0 is vLLM's "False" (batch unchanged). The order within a
 * region is not kept. order, optional ([num_reqs]), receives the original position of the request that
 * ends at each position. */
UATTN_API uattn_status uattn_reorder_batch_to_split_decodes_and_prefills(int32_t num_reqs, const int32_t *num_scheduled,
                                                                         const int32_t *num_computed,
                                                                         int32_t decode_threshold, uattn_swap *swaps,
                                                                         int32_t swaps_capacity, int32_t *num_swaps,
                                                                         int32_t *order);

/* Today's vLLM reorder_batch_to_split_decodes_and_prefills, which also takes each request's prompt length
 * num_prompt (each >= 1): the swaps that put the batch in decode -> short extend -> long extend -> prefill
 * order, where a prefill has num_computed == 0, a long extend num_scheduled > decode_threshold, a decode
 * num_computed >= num_prompt (done with its prompt) and a short extend is the rest (a prompt chunk of at
 * most decode_threshold tokens). Swaps, their number (the fewest possible, so a capacity of num_reqs
 * suffices), *num_swaps == 0 and order as in uattn_reorder_batch_to_split_decodes_and_prefills. Each
 * request lands in vLLM's region; the order within a region is not kept (vLLM's is another one, the
 * cost of its longer swap sequences). */
UATTN_API uattn_status uattn_reorder_batch_with_prompt_lens(int32_t num_reqs, const int32_t *num_scheduled,
                                                            const int32_t *num_computed, const int32_t *num_prompt,
                                                            int32_t decode_threshold, uattn_swap *swaps,
                                                            int32_t swaps_capacity, int32_t *num_swaps, int32_t *order);

/* How many virtual batches uattn_make_local_attention_virtual_batches makes, and the block-table
 * columns of each (attn_chunk_size / block_size). attn_chunk_size and block_size > 0, attn_chunk_size a
 * multiple of block_size; seq_lens [num_reqs], each >= the request's query length. */
UATTN_API uattn_status uattn_count_local_attention_virtual_batches(int32_t attn_chunk_size, int32_t block_size,
                                                                   int32_t num_reqs, const int32_t *query_start_loc,
                                                                   const int32_t *seq_lens, int32_t *num_batches,
                                                                   int32_t *pages_per_batch);

/* The outputs of uattn_make_local_attention_virtual_batches. The caller sets capacity and the arrays;
 * any array may be NULL to skip it. The call sets the rest. */
typedef struct uattn_local_batches {
  int32_t capacity;         /* virtual batches each array holds */
  int32_t *query_start_loc; /* [capacity + 1] */
  int32_t *seq_lens;        /* [capacity] keys of each virtual batch */
  int32_t *num_computed;    /* [capacity] seq_lens - query length */
  int32_t *block_table;     /* [capacity, pages_per_batch] row-major */
  int32_t *req_indices;     /* [capacity] the request each virtual batch comes from */
  int32_t num_batches;
  int32_t pages_per_batch;
  int32_t max_query_len; /* 0 when num_reqs == 0 */
  int32_t max_seq_len;
} uattn_local_batches;

/* vLLM's make_local_attention_virtual_batches (chunked local attention, as in Llama 4): each request
 * is cut at multiples of attn_chunk_size of its positions into virtual batches that attend only within
 * their chunk; a virtual batch's block-table row holds the pages of its chunk. block_table is
 * [num_reqs, block_table_stride] (stride = columns, >= 1; needed only when out->block_table is set);
 * columns past the row are clamped to its last column as in vLLM. To rebuild only the block table
 * from a changed block table (vLLM's returned make_block_table), call again with only
 * out->block_table set. vLLM's quirks kept: a request with no query tokens still makes one virtual batch;
 * with seq_len 0 too, that batch claims attn_chunk_size keys and its pages come from the row's last
 * columns (numpy's negative indexing; column 0 where the row is shorter than a chunk, where vLLM
 * raises). */
UATTN_API uattn_status uattn_make_local_attention_virtual_batches(int32_t attn_chunk_size, int32_t block_size,
                                                                  int32_t num_reqs, const int32_t *query_start_loc,
                                                                  const int32_t *seq_lens, const int32_t *block_table,
                                                                  int32_t block_table_stride, uattn_local_batches *out);

/* vLLM v0's compute_slot_mapping_start_idx: the first token of a prompt whose K/V is written when a
 * sliding window is in use, max(0, query_len - sliding_window), else 0. sliding_window 0 means none.
 * context_len is checked but unused, as in vLLM. */
UATTN_API uattn_status uattn_compute_slot_mapping_start_idx(bool is_prompt, int32_t query_len, int32_t context_len,
                                                            int32_t sliding_window, int32_t *start_idx);

/* vLLM v0's compute_slot_mapping for one sequence: the cache slot of each of its tokens at positions
 * [context_len, seq_len), UATTN_PAD_SLOT_ID for positions before start_idx; in a profile run (no block
 * table yet) seq_len pad slots. So *num_slots is seq_len in a profile run, else seq_len - context_len.
 * slot = block_table[p / block_size] * block_size + p % block_size; block_table (block_table_len entries,
 * ids >= 0) may be NULL in a profile run. context_len <= seq_len, start_idx <= seq_len. */
UATTN_API uattn_status uattn_compute_slot_mapping(bool is_profile_run, int32_t seq_len, int32_t context_len,
                                                  int32_t start_idx, int32_t block_size, const int32_t *block_table,
                                                  int32_t block_table_len, int64_t *slot_mapping, int32_t capacity,
                                                  int32_t *num_slots);

/* Requests [start, end). */
typedef struct uattn_req_range {
  int32_t start;
  int32_t end;
} uattn_req_range;

/* vLLM's split_prefill_chunks: cuts requests into consecutive chunks, greedily, each as long as its
 * seq_lens sum stays <= workspace_size; every seq_len must be <= workspace_size. Bounds are shifted by
 * request_offset (>= 0). There are at most num_reqs chunks. */
UATTN_API uattn_status uattn_split_prefill_chunks(const int32_t *seq_lens, int32_t num_reqs, int32_t workspace_size,
                                                  int32_t request_offset, uattn_req_range *chunks, int32_t capacity,
                                                  int32_t *num_chunks);

/* vLLM's get_dcp_local_seq_lens: how many of each sequence's keys the KV cache of a decode-context-
 * parallel rank holds, keys being dealt to the dcp_size ranks in runs of interleave (>= 1). With dcp_rank
 * in [0, dcp_size): out[r] for that rank (num_reqs values). With dcp_rank == -1 (vLLM's None): every
 * rank, out[r * dcp_size + rank] (num_reqs * dcp_size values). */
UATTN_API uattn_status uattn_compute_dcp_local_seq_lens(const int32_t *seq_lens, int32_t num_reqs, int32_t dcp_size,
                                                        int32_t dcp_rank, int32_t interleave, int32_t *out,
                                                        int32_t capacity);

/* Scalars of the fast-prefill metadata (the rest passes through unchanged). */
typedef struct uattn_fast_prefill_info {
  bool unchanged;            /* no request had more than one query token: vLLM returns its input */
  int32_t num_actual_tokens; /* rows kept: num_logits (qsl[num_reqs] when unchanged) */
  int32_t max_query_len;     /* most rows kept in one request */
} uattn_fast_prefill_info;

/* vLLM's make_kv_sharing_fast_prefill_common_attn_metadata: with KV sharing, only the query rows that
 * are sampled (logits_indices, num_logits of them, each in [0, qsl[num_reqs]), any order) need attention
 * in the later layers; query_start_loc_out ([num_reqs + 1]) counts those rows per request (seq_lens,
 * block table and slot mapping stay as they are). When the longest query is exactly 1 token the input
 * is returned as is (copied) and logits_indices may be NULL. */
UATTN_API uattn_status uattn_make_kv_sharing_fast_prefill_metadata(int32_t num_reqs, const int32_t *query_start_loc,
                                                                   const int32_t *logits_indices, int32_t num_logits,
                                                                   int32_t *query_start_loc_out,
                                                                   uattn_fast_prefill_info *info);

/* vLLM's BLOCK_M for causal_conv1d: query tokens per program. */
#define UATTN_CAUSAL_CONV1D_BLOCK_M 8

/* The programs uattn_compute_causal_conv1d_metadata writes (sum of ceil(query length / block_m)), and the
 * length of vLLM's pre-padded buffers, 2 * max(1024, num_programs). query_start_loc here is the
 * prefills' own (num_reqs + 1 entries, >= 0, non-decreasing; need not start at 0). */
UATTN_API uattn_status uattn_count_causal_conv1d_programs(const int32_t *query_start_loc, int32_t num_reqs,
                                                          int32_t block_m, int32_t *num_programs,
                                                          int32_t *padded_buffer_len);

/* vLLM's compute_causal_conv1d_metadata: one program per block_m query tokens of each request;
 * batch_ptr[i] is program i's request and token_chunk_offset_ptr[i] its block within the request;
 * [num_programs, capacity) is filled with UATTN_PAD_SLOT_ID (capacity = padded_buffer_len gives vLLM's
 * buffers). programs_per_req ([num_reqs], optional) receives vLLM's "nums". */
UATTN_API uattn_status uattn_compute_causal_conv1d_metadata(const int32_t *query_start_loc, int32_t num_reqs,
                                                            int32_t block_m, int32_t *programs_per_req,
                                                            int32_t *batch_ptr, int32_t *token_chunk_offset_ptr,
                                                            int32_t capacity, int32_t *num_programs);

/* vLLM's AttentionType. */

/* Query and key/value token counts of one attention call. */
typedef struct uattn_query_kv_tokens {
  int32_t num_prefill_query_tokens;
  int32_t num_prefill_kv_tokens;
  int32_t num_decode_query_tokens;
} uattn_query_kv_tokens;

/* vLLM v0's get_num_prefill_decode_query_kv_tokens. Encoder: num_encoder_tokens for prefill queries
 * and keys, no decode. Encoder-decoder: the decoder's prefill and decode tokens query, the encoder's
 * tokens are the prefill keys. Decoder and encoder-only: num_prefill_tokens for both, plus the decode
 * tokens. num_encoder_tokens -1 means unset (vLLM's None), an error for the encoder types. */
UATTN_API uattn_status uattn_count_query_kv_tokens(uattn_attention_type type, int32_t num_prefill_tokens,
                                                   int32_t num_decode_tokens, int32_t num_encoder_tokens,
                                                   uattn_query_kv_tokens *out);

/* The sequence-length and block-table fields of a v0 attention metadata. */
typedef struct uattn_attention_metadata {
  const int32_t *seq_lens; /* decoder self-attention */
  int32_t max_prefill_seq_len;
  int32_t max_decode_seq_len;
  const int32_t *block_tables;
  int32_t block_tables_stride;
  const int32_t *encoder_seq_lens; /* encoder and cross-attention */
  int32_t max_encoder_seq_len;
  const int32_t *cross_block_tables;
  int32_t cross_block_tables_stride;
} uattn_attention_metadata;

/* The fields one attention call reads. */
typedef struct uattn_seq_len_block_table {
  const int32_t *seq_lens;
  int32_t max_seq_len;
  const int32_t *block_tables; /* NULL for encoder attention: it reads no cache */
  int32_t block_tables_stride;
} uattn_seq_len_block_table;

/* vLLM v0's get_seq_len_block_table_args: decoder -> seq_lens, max prefill or decode seq len (by
 * is_prompt), block_tables; encoder-decoder -> encoder seq lens and max, cross block tables; encoder ->
 * encoder seq lens and max, no block table; encoder-only -> UATTN_ERR_UNSUPPORTED (vLLM raises). The
 * fields chosen must be set (pointers non-NULL, lengths >= 0). */
UATTN_API uattn_status uattn_select_seq_len_block_table(const uattn_attention_metadata *metadata, bool is_prompt,
                                                        uattn_attention_type type, uattn_seq_len_block_table *out);

#ifdef __cplusplus
}
#endif

#endif
