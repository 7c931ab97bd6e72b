/* vLLM's batch helpers (include/uattn_vllm.h) that build a batch's metadata other than its decode/prefill
 * split (decode_prefill_split.c): local-attention virtual batches, slot mapping, prefill chunks, DCP local
 * sequence lengths, KV-sharing fast prefill, causal conv1d programs and the v0 attention types' arguments.
 * The checks they share, and the rule they all follow, are in batch_checks.h. */
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/internal.h"
#include "uattn_vllm.h"
#include "vllm/batch_checks.h"

/* ---- local attention virtual batches (make_local_attention_virtual_batches) ------------------------ */

typedef struct local_req {
  int32_t q;       /* query tokens */
  int32_t q_first; /* of them, in the chunk that holds the first one */
  int32_t blocks;  /* virtual batches: chunks the queries touch */
  int32_t k_last;  /* keys in the last chunk: seq_len mod chunk, a full chunk when that is 0 */
} local_req;

static local_req local_req_of(int32_t chunk, int32_t q, int32_t seq_len) {
  local_req l;
  l.q = q;
  int32_t context = seq_len - q;
  l.q_first = uattn_min_i32(chunk - context % chunk, q);
  l.blocks = 1 + uattn_ceil_div_i32(q - l.q_first, chunk);
  int32_t tail = seq_len % chunk;
  l.k_last = tail == 0 ? chunk : tail;
  return l;
}

/* The most query tokens and keys of any of a request's virtual batches, without visiting them: at chunk 1 a
 * request of INT32_MAX tokens has that many, and a call that fills no array must not walk them all. */
static void local_req_max(const local_req *l, int32_t chunk, int32_t *max_q, int32_t *max_k) {
  int32_t q = l->q_first, k = l->k_last;
  if (l->blocks > 1) {
    q = uattn_max_i32(q, uattn_min_i32(l->q - l->q_first, chunk)); /* the second batch holds the most */
    k = chunk;                                                     /* every batch but the last is full */
  }
  *max_q = uattn_max_i32(*max_q, q);
  *max_k = uattn_max_i32(*max_k, k);
}

static uattn_status check_local_args(int32_t attn_chunk_size, int32_t block_size, int32_t num_reqs, const int32_t *qsl,
                                     const int32_t *seq_lens, int64_t *num_batches) {
  uattn_status st;
  if (attn_chunk_size <= 0)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "attn_chunk_size must be > 0, got %d", attn_chunk_size);
  if (block_size <= 0) return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "block_size must be > 0, got %d", block_size);
  if (attn_chunk_size % block_size != 0)
    return uattn_fail(UATTN_ERR_INCONSISTENT, "attn_chunk_size %d is not divisible by block_size %d", attn_chunk_size,
                      block_size);
  if ((st = check_count(num_reqs, "num_reqs")) != UATTN_OK) return st;
  if ((st = uattn_vllm_check_qsl(qsl, num_reqs, true)) != UATTN_OK) return st;
  if ((st = uattn_vllm_check_seq_lens(seq_lens, qsl, num_reqs)) != UATTN_OK) return st;
  int64_t v = 0;
  for (int32_t r = 0; r < num_reqs; r++) v += local_req_of(attn_chunk_size, query_len(qsl, r), seq_lens[r]).blocks;
  if (v > INT32_MAX) return uattn_fail(UATTN_ERR_OVERFLOW, "%lld virtual batches do not fit int32", (long long)v);
  *num_batches = v;
  return UATTN_OK;
}

uattn_status uattn_count_local_attention_virtual_batches(int32_t attn_chunk_size, int32_t block_size, int32_t num_reqs,
                                                         const int32_t *query_start_loc, const int32_t *seq_lens,
                                                         int32_t *num_batches, int32_t *pages_per_batch) {
  uattn_clear_error();
  UATTN_CHECK_PTR(num_batches, "num_batches");
  UATTN_CHECK_PTR(pages_per_batch, "pages_per_batch");
  int64_t v = 0;
  uattn_status st = check_local_args(attn_chunk_size, block_size, num_reqs, query_start_loc, seq_lens, &v);
  if (st != UATTN_OK) return st;
  *num_batches = (int32_t)v;
  *pages_per_batch = attn_chunk_size / block_size;
  return UATTN_OK;
}

/* numpy's floor division, for the one negative key start the seed produces (an empty request). */
static int64_t floor_div_i64(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

uattn_status uattn_make_local_attention_virtual_batches(int32_t attn_chunk_size, int32_t block_size, int32_t num_reqs,
                                                        const int32_t *query_start_loc, const int32_t *seq_lens,
                                                        const int32_t *block_table, int32_t block_table_stride,
                                                        uattn_local_batches *out) {
  uattn_clear_error();
  UATTN_CHECK_PTR(out, "out");
  int64_t v = 0;
  uattn_status st = check_local_args(attn_chunk_size, block_size, num_reqs, query_start_loc, seq_lens, &v);
  if (st != UATTN_OK) return st;
  const int32_t pages = attn_chunk_size / block_size;
  if ((st = check_count(out->capacity, "out->capacity")) != UATTN_OK) return st;
  UATTN_CHECK_ALIGNED(out->query_start_loc, "out->query_start_loc");
  UATTN_CHECK_ALIGNED(out->seq_lens, "out->seq_lens");
  UATTN_CHECK_ALIGNED(out->num_computed, "out->num_computed");
  UATTN_CHECK_ALIGNED(out->block_table, "out->block_table");
  UATTN_CHECK_ALIGNED(out->req_indices, "out->req_indices");
  const bool any_array =
      out->query_start_loc || out->seq_lens || out->num_computed || out->block_table || out->req_indices;
  if (any_array && v > out->capacity) return capacity_error("local attention virtual batches", v, out->capacity);
  if (out->block_table) {
    if (num_reqs > 0) UATTN_CHECK_PTR(block_table, "block_table (to fill out->block_table)");
    if (block_table_stride < 1)
      return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "block_table_stride must be >= 1, got %d", block_table_stride);
    if (v * pages > INT32_MAX)
      return uattn_fail(UATTN_ERR_OVERFLOW, "the local block table's %lld x %d entries do not fit int32", (long long)v,
                        pages);
  }

  const int32_t chunk = attn_chunk_size;
  const int32_t *qsl = query_start_loc;
  int32_t max_q = 0, max_k = 0, vb = 0;
  if (out->query_start_loc) out->query_start_loc[0] = 0;
  int32_t q_total = 0;
  for (int32_t r = 0; r < num_reqs; r++) {
    const local_req l = local_req_of(chunk, query_len(qsl, r), seq_lens[r]);
    local_req_max(&l, chunk, &max_q, &max_k);
    if (!any_array) {
      vb += l.blocks;
      continue;
    }
    for (int32_t k = 0; k < l.blocks; k++, vb++) {
      int32_t q_local = k == 0 ? l.q_first : uattn_min_i32(l.q - l.q_first - chunk * (k - 1), chunk);
      int32_t k_local = k == l.blocks - 1 ? l.k_last : chunk;
      q_total += q_local;
      if (out->query_start_loc) out->query_start_loc[vb + 1] = q_total;
      if (out->seq_lens) out->seq_lens[vb] = k_local;
      if (out->num_computed) out->num_computed[vb] = k_local - q_local;
      if (out->req_indices) out->req_indices[vb] = r;
      if (out->block_table) {
        /* Chunks are counted back from the last one, which ends at seq_len with k_last keys. */
        int64_t k_start = (int64_t)seq_lens[r] - ((int64_t)(l.blocks - 1 - k) * chunk + l.k_last);
        int64_t first_page = floor_div_i64(k_start, block_size);
        const int32_t *row = block_table + (size_t)r * (size_t)block_table_stride;
        int32_t *dst = out->block_table + (size_t)vb * (size_t)pages;
        for (int32_t j = 0; j < pages; j++) {
          int64_t col = first_page + j;
          if (col > block_table_stride - 1) col = block_table_stride - 1; /* the seed's clip(max=) */
          if (col < 0) col += block_table_stride;                         /* numpy's negative index */
          if (col < 0) col = 0;                                           /* where the seed raises */
          dst[j] = row[col];
        }
      }
    }
  }
  out->num_batches = vb;
  out->pages_per_batch = pages;
  out->max_query_len = max_q;
  out->max_seq_len = max_k;
  return UATTN_OK;
}

/* ---- slot mapping (v0 compute_slot_mapping_start_idx, compute_slot_mapping) ----------------------- */

uattn_status uattn_compute_slot_mapping_start_idx(bool is_prompt, int32_t query_len_, int32_t context_len,
                                                  int32_t sliding_window, int32_t *start_idx) {
  uattn_clear_error();
  UATTN_CHECK_PTR(start_idx, "start_idx");
  CHECK_COUNTS({query_len_, "query_len"}, {context_len, "context_len"},
               {sliding_window, "sliding_window (0 for none)"});
  /* The seed measures the window from the query's length, not its end position: with chunked prefill
   * (context_len > 0) that keeps more slots than the window needs. Kept as is. */
  *start_idx = (is_prompt && sliding_window > 0) ? uattn_max_i32(0, query_len_ - sliding_window) : 0;
  return UATTN_OK;
}

uattn_status uattn_compute_slot_mapping(bool is_profile_run, int32_t seq_len, int32_t context_len, int32_t start_idx,
                                        int32_t block_size, const int32_t *block_table, int32_t block_table_len,
                                        int64_t *slot_mapping, int32_t capacity, int32_t *num_slots) {
  uattn_clear_error();
  UATTN_CHECK_PTR(num_slots, "num_slots");
  uattn_status st;
  CHECK_COUNTS({seq_len, "seq_len"}, {context_len, "context_len"}, {start_idx, "start_idx"}, {capacity, "capacity"});
  if (block_size <= 0) return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "block_size must be > 0, got %d", block_size);
  if (context_len > seq_len)
    return uattn_fail(UATTN_ERR_INCONSISTENT, "context_len = %d is past seq_len = %d", context_len, seq_len);
  if (start_idx > seq_len)
    return uattn_fail(UATTN_ERR_INCONSISTENT, "start_idx = %d is past seq_len = %d", start_idx, seq_len);
  if (capacity > 0) UATTN_CHECK_PTR(slot_mapping, "slot_mapping (with capacity > 0)");

  const int32_t n = is_profile_run ? seq_len : seq_len - context_len;
  if (n > capacity) return capacity_error("slot_mapping", n, capacity);
  if (is_profile_run) {
    for (int32_t i = 0; i < n; i++) slot_mapping[i] = UATTN_PAD_SLOT_ID;
    *num_slots = n;
    return UATTN_OK;
  }

  const int32_t pad = uattn_max_i32(0, start_idx - context_len);
  const int32_t begin = uattn_max_i32(start_idx, context_len);
  if (begin < seq_len) {
    UATTN_CHECK_PTR(block_table, "block_table");
    if ((st = check_count(block_table_len, "block_table_len")) != UATTN_OK) return st;
    const int32_t last_block = (seq_len - 1) / block_size;
    if (last_block >= block_table_len)
      return uattn_fail(UATTN_ERR_OUT_OF_RANGE, "position %d needs block table entry %d, but the table has %d entries",
                        seq_len - 1, last_block, block_table_len);
    for (int32_t b = begin / block_size; b <= last_block; b++) {
      if (block_table[b] < 0)
        return uattn_fail(UATTN_ERR_OUT_OF_RANGE, "block_table[%d] = %d is not a block id", b, block_table[b]);
    }
  }
  for (int32_t i = 0; i < pad; i++) slot_mapping[i] = UATTN_PAD_SLOT_ID;
  for (int32_t p = begin; p < seq_len; p++)
    slot_mapping[pad + (p - begin)] = (int64_t)block_table[p / block_size] * block_size + p % block_size;
  *num_slots = n;
  return UATTN_OK;
}

/* ---- prefill chunks (split_prefill_chunks) --------------------------------------------------------- */

/* The greedy chunking; writes only when chunks is non-NULL, so it also counts. */
static int32_t prefill_chunks(const int32_t *seq_lens, int32_t num_reqs, int32_t workspace_size, int32_t request_offset,
                              uattn_req_range *chunks) {
  int32_t n = 0, i = 0;
  while (i < num_reqs) {
    int32_t start = i;
    int64_t total = 0;
    while (i < num_reqs && total + seq_lens[i] <= workspace_size) total += seq_lens[i++];
    if (chunks) chunks[n] = (uattn_req_range){start + request_offset, i + request_offset};
    n++;
  }
  return n;
}

uattn_status uattn_split_prefill_chunks(const int32_t *seq_lens, int32_t num_reqs, int32_t workspace_size,
                                        int32_t request_offset, uattn_req_range *chunks, int32_t capacity,
                                        int32_t *num_chunks) {
  uattn_clear_error();
  UATTN_CHECK_PTR(num_chunks, "num_chunks");
  CHECK_COUNTS({num_reqs, "num_reqs"}, {workspace_size, "workspace_size"}, {request_offset, "request_offset"},
               {capacity, "capacity"});
  if (capacity > 0) UATTN_CHECK_PTR(chunks, "chunks (with capacity > 0)");
  if (num_reqs > 0) UATTN_CHECK_PTR(seq_lens, "seq_lens");
  if ((int64_t)request_offset + num_reqs > INT32_MAX)
    return uattn_fail(UATTN_ERR_OVERFLOW, "request_offset %d + num_reqs %d does not fit int32", request_offset,
                      num_reqs);
  for (int32_t i = 0; i < num_reqs; i++) {
    if (seq_lens[i] < 0)
      return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "seq_lens[%d] must be >= 0, got %d", i, seq_lens[i]);
    /* The seed asserts this: a longer request could never fit, and the greedy loop would not advance. */
    if (seq_lens[i] > workspace_size)
      return uattn_fail(UATTN_ERR_INCONSISTENT, "seq_lens[%d] = %d is more than workspace_size = %d", i, seq_lens[i],
                        workspace_size);
  }
  int32_t n = prefill_chunks(seq_lens, num_reqs, workspace_size, request_offset, NULL);
  if (n > capacity) return capacity_error("chunks", n, capacity);
  prefill_chunks(seq_lens, num_reqs, workspace_size, request_offset, chunks);
  *num_chunks = n;
  return UATTN_OK;
}

/* ---- DCP local sequence lengths (get_dcp_local_seq_lens) ------------------------------------------- */

/* Keys go to ranks in runs of `interleave`, round robin: each rank gets `base` from the full rounds and a
 * share of the last partial round, whose runs go to rank 0 first. */
static int32_t dcp_local_len(int32_t seq_len, int32_t dcp_size, int32_t rank, int32_t interleave) {
  int64_t base = (int64_t)(seq_len / interleave / dcp_size) * interleave;
  int64_t rem = seq_len - base * dcp_size;
  int64_t share = rem - (int64_t)rank * interleave;
  share = share < 0 ? 0 : (share > interleave ? interleave : share);
  return (int32_t)(base + share);
}

uattn_status uattn_compute_dcp_local_seq_lens(const int32_t *seq_lens, int32_t num_reqs, int32_t dcp_size,
                                              int32_t dcp_rank, int32_t interleave, int32_t *out, int32_t capacity) {
  uattn_clear_error();
  CHECK_COUNTS({num_reqs, "num_reqs"}, {capacity, "capacity"});
  if (dcp_size < 1) return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "dcp_size must be >= 1, got %d", dcp_size);
  if (interleave < 1) return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "interleave must be >= 1, got %d", interleave);
  if (dcp_rank < -1 || dcp_rank >= dcp_size)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "dcp_rank must be -1 (all ranks) or in [0, %d), got %d", dcp_size,
                      dcp_rank);
  if (num_reqs > 0) UATTN_CHECK_PTR(seq_lens, "seq_lens");
  if (capacity > 0) UATTN_CHECK_PTR(out, "out (with capacity > 0)");
  const int64_t needed = dcp_rank == -1 ? (int64_t)num_reqs * dcp_size : num_reqs;
  if (needed > INT32_MAX)
    return uattn_fail(UATTN_ERR_OVERFLOW, "%d requests x %d ranks do not fit int32", num_reqs, dcp_size);
  if (needed > capacity) return capacity_error("dcp local seq lens", needed, capacity);
  for (int32_t r = 0; r < num_reqs; r++) {
    if (seq_lens[r] < 0)
      return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "seq_lens[%d] must be >= 0, got %d", r, seq_lens[r]);
  }
  for (int32_t r = 0; r < num_reqs; r++) {
    if (dcp_rank >= 0) {
      out[r] = dcp_local_len(seq_lens[r], dcp_size, dcp_rank, interleave);
    } else {
      for (int32_t k = 0; k < dcp_size; k++)
        out[(size_t)r * (size_t)dcp_size + (size_t)k] = dcp_local_len(seq_lens[r], dcp_size, k, interleave);
    }
  }
  return UATTN_OK;
}

/* ---- KV-sharing fast prefill (make_kv_sharing_fast_prefill_common_attn_metadata) ---------------- */

/* The request owning query row `row`: the number of qsl[1..num_reqs] <= row (torch.bucketize with
 * right=True), which skips empty requests. */
static int32_t request_of_row(const int32_t *qsl, int32_t num_reqs, int32_t row) {
  int32_t lo = 0, hi = num_reqs; /* answer in [lo, hi] */
  while (lo < hi) {
    int32_t mid = lo + (hi - lo) / 2;
    if (qsl[mid + 1] <= row)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

uattn_status uattn_make_kv_sharing_fast_prefill_metadata(int32_t num_reqs, const int32_t *query_start_loc,
                                                         const int32_t *logits_indices, int32_t num_logits,
                                                         int32_t *query_start_loc_out, uattn_fast_prefill_info *info) {
  uattn_clear_error();
  UATTN_CHECK_PTR(info, "info");
  UATTN_CHECK_PTR(query_start_loc_out, "query_start_loc_out");
  uattn_status st;
  CHECK_COUNTS({num_reqs, "num_reqs"}, {num_logits, "num_logits"});
  if ((st = uattn_vllm_check_qsl(query_start_loc, num_reqs, true)) != UATTN_OK) return st;
  const int32_t *qsl = query_start_loc;
  const int32_t max_q = max_query_len(qsl, num_reqs);

  if (max_q == 1) {
    for (int32_t r = 0; r <= num_reqs; r++) query_start_loc_out[r] = qsl[r];
    *info = (uattn_fast_prefill_info){.unchanged = true, .num_actual_tokens = qsl[num_reqs], .max_query_len = 1};
    return UATTN_OK;
  }
  if (num_logits > 0) UATTN_CHECK_PTR(logits_indices, "logits_indices");
  for (int32_t i = 0; i < num_logits; i++) {
    if (logits_indices[i] < 0 || logits_indices[i] >= qsl[num_reqs])
      return uattn_fail(UATTN_ERR_OUT_OF_RANGE, "logits_indices[%d] = %d is not a query row of [0, %d)", i,
                        logits_indices[i], qsl[num_reqs]);
  }
  /* Counts land one slot to the right so that the prefix sum turns them into start locations in place. */
  for (int32_t r = 0; r <= num_reqs; r++) query_start_loc_out[r] = 0;
  for (int32_t i = 0; i < num_logits; i++) query_start_loc_out[request_of_row(qsl, num_reqs, logits_indices[i]) + 1]++;
  int32_t most = 0;
  for (int32_t r = 0; r < num_reqs; r++) {
    most = uattn_max_i32(most, query_start_loc_out[r + 1]);
    query_start_loc_out[r + 1] += query_start_loc_out[r];
  }
  *info = (uattn_fast_prefill_info){.unchanged = false, .num_actual_tokens = num_logits, .max_query_len = most};
  return UATTN_OK;
}

/* ---- causal conv1d (compute_causal_conv1d_metadata) ------------------------------------------------ */

static uattn_status conv1d_programs(const int32_t *qsl, int32_t num_reqs, int32_t block_m, int64_t *total) {
  uattn_status st;
  if ((st = check_count(num_reqs, "num_reqs")) != UATTN_OK) return st;
  if (block_m <= 0) return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "block_m must be > 0, got %d", block_m);
  if ((st = uattn_vllm_check_qsl(qsl, num_reqs, false)) != UATTN_OK) return st;
  int64_t t = 0;
  for (int32_t r = 0; r < num_reqs; r++) t += uattn_ceil_div_i32(query_len(qsl, r), block_m);
  if (t > INT32_MAX) return uattn_fail(UATTN_ERR_OVERFLOW, "%lld programs do not fit int32", (long long)t);
  *total = t;
  return UATTN_OK;
}

uattn_status uattn_count_causal_conv1d_programs(const int32_t *query_start_loc, int32_t num_reqs, int32_t block_m,
                                                int32_t *num_programs, int32_t *padded_buffer_len) {
  uattn_clear_error();
  UATTN_CHECK_PTR(num_programs, "num_programs");
  UATTN_CHECK_ALIGNED(padded_buffer_len, "padded_buffer_len");
  int64_t t = 0;
  uattn_status st = conv1d_programs(query_start_loc, num_reqs, block_m, &t);
  if (st != UATTN_OK) return st;
  /* The seed keeps its Triton grid buffers at least 2048 long and twice the need, to avoid regrowing. */
  const int64_t seed_len = 2 * (t > 1024 ? t : 1024);
  if (padded_buffer_len && seed_len > INT32_MAX)
    return uattn_fail(UATTN_ERR_OVERFLOW, "the seed's buffer length %lld does not fit int32", (long long)seed_len);
  *num_programs = (int32_t)t;
  if (padded_buffer_len) *padded_buffer_len = (int32_t)seed_len;
  return UATTN_OK;
}

uattn_status uattn_compute_causal_conv1d_metadata(const int32_t *query_start_loc, int32_t num_reqs, int32_t block_m,
                                                  int32_t *programs_per_req, int32_t *batch_ptr,
                                                  int32_t *token_chunk_offset_ptr, int32_t capacity,
                                                  int32_t *num_programs) {
  uattn_clear_error();
  UATTN_CHECK_PTR(num_programs, "num_programs");
  uattn_status st;
  if ((st = check_count(capacity, "capacity")) != UATTN_OK) return st;
  if (capacity > 0) {
    UATTN_CHECK_PTR(batch_ptr, "batch_ptr (with capacity > 0)");
    UATTN_CHECK_PTR(token_chunk_offset_ptr, "token_chunk_offset_ptr (with capacity > 0)");
  }
  UATTN_CHECK_ALIGNED(programs_per_req, "programs_per_req");
  int64_t t = 0;
  if ((st = conv1d_programs(query_start_loc, num_reqs, block_m, &t)) != UATTN_OK) return st;
  if (t > capacity) return capacity_error("causal conv1d programs", t, capacity);
  int32_t i = 0;
  for (int32_t r = 0; r < num_reqs; r++) {
    int32_t nums = uattn_ceil_div_i32(query_len(query_start_loc, r), block_m);
    if (programs_per_req) programs_per_req[r] = nums;
    for (int32_t k = 0; k < nums; k++, i++) {
      batch_ptr[i] = r;
      token_chunk_offset_ptr[i] = k;
    }
  }
  for (; i < capacity; i++) batch_ptr[i] = token_chunk_offset_ptr[i] = UATTN_PAD_SLOT_ID;
  *num_programs = (int32_t)t;
  return UATTN_OK;
}

/* ---- attention types (v0 get_num_prefill_decode_query_kv_tokens, get_seq_len_block_table_args) ---- */

static bool valid_attention_type(uattn_attention_type type) {
  return type == UATTN_ATTENTION_DECODER || type == UATTN_ATTENTION_ENCODER || type == UATTN_ATTENTION_ENCODER_ONLY ||
         type == UATTN_ATTENTION_ENCODER_DECODER;
}

uattn_status uattn_count_query_kv_tokens(uattn_attention_type type, int32_t num_prefill_tokens,
                                         int32_t num_decode_tokens, int32_t num_encoder_tokens,
                                         uattn_query_kv_tokens *out) {
  uattn_clear_error();
  UATTN_CHECK_PTR(out, "out");
  if (!valid_attention_type(type))
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "unknown attention type %d", (int)type);
  CHECK_COUNTS({num_prefill_tokens, "num_prefill_tokens"}, {num_decode_tokens, "num_decode_tokens"});
  if (num_encoder_tokens < -1)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "num_encoder_tokens must be >= 0, or -1 for unset; got %d",
                      num_encoder_tokens);
  const bool needs_encoder = type == UATTN_ATTENTION_ENCODER || type == UATTN_ATTENTION_ENCODER_DECODER;
  if (needs_encoder && num_encoder_tokens == -1)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "num_encoder_tokens must be set for %s attention",
                      type == UATTN_ATTENTION_ENCODER ? "encoder" : "encoder-decoder");
  uattn_query_kv_tokens t;
  switch (type) {
  case UATTN_ATTENTION_ENCODER: /* runs once, at prefill, over the encoder's own tokens */
    t = (uattn_query_kv_tokens){num_encoder_tokens, num_encoder_tokens, 0};
    break;
  case UATTN_ATTENTION_ENCODER_DECODER: /* decoder queries, encoder keys */
    t = (uattn_query_kv_tokens){num_prefill_tokens, num_encoder_tokens, num_decode_tokens};
    break;
  default: t = (uattn_query_kv_tokens){num_prefill_tokens, num_prefill_tokens, num_decode_tokens}; break;
  }
  *out = t;
  return UATTN_OK;
}

uattn_status uattn_select_seq_len_block_table(const uattn_attention_metadata *metadata, bool is_prompt,
                                              uattn_attention_type type, uattn_seq_len_block_table *out) {
  uattn_clear_error();
  UATTN_CHECK_PTR(metadata, "metadata");
  UATTN_CHECK_PTR(out, "out");
  if (!valid_attention_type(type))
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "unknown attention type %d", (int)type);
  const uattn_attention_metadata *m = metadata;
  uattn_seq_len_block_table t = {0};
  switch (type) {
  case UATTN_ATTENTION_DECODER:
    UATTN_CHECK_PTR(m->seq_lens, "metadata->seq_lens");
    UATTN_CHECK_PTR(m->block_tables, "metadata->block_tables");
    t.seq_lens = m->seq_lens;
    t.max_seq_len = is_prompt ? m->max_prefill_seq_len : m->max_decode_seq_len;
    t.block_tables = m->block_tables;
    t.block_tables_stride = m->block_tables_stride;
    if (t.max_seq_len < 0)
      return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "metadata->%s must be >= 0, got %d",
                        is_prompt ? "max_prefill_seq_len" : "max_decode_seq_len", t.max_seq_len);
    break;
  case UATTN_ATTENTION_ENCODER_DECODER:
  case UATTN_ATTENTION_ENCODER:
    UATTN_CHECK_PTR(m->encoder_seq_lens, "metadata->encoder_seq_lens");
    if (m->max_encoder_seq_len < 0)
      return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "metadata->max_encoder_seq_len must be >= 0, got %d",
                        m->max_encoder_seq_len);
    t.seq_lens = m->encoder_seq_lens;
    t.max_seq_len = m->max_encoder_seq_len;
    if (type == UATTN_ATTENTION_ENCODER_DECODER) {
      UATTN_CHECK_PTR(m->cross_block_tables, "metadata->cross_block_tables");
      t.block_tables = m->cross_block_tables;
      t.block_tables_stride = m->cross_block_tables_stride;
    }
    break;
  case UATTN_ATTENTION_ENCODER_ONLY:
    return uattn_fail(UATTN_ERR_UNSUPPORTED,
                      "encoder-only attention reads no sequence lengths or block tables (the seed raises)");
  }
  if (t.block_tables && t.block_tables_stride < 0)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "block table stride must be >= 0, got %d", t.block_tables_stride);
  *out = t;
  return UATTN_OK;
}
