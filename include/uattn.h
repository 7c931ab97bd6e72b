/*
 * uattn — unified-batch paged attention for CPUs.
 *
 * One inference step's attention for a batch that mixes prefills, chunked prefills, decodes and
 * speculative-decode verification, over a paged KV cache. This header is the whole public API.
 *
 * Conventions
 *  - Every function returns a uattn_status. On an error, uattn_last_error() gives a message for this
 *    thread, and nothing the call was given to write (plan, caches, outputs) has been changed.
 *  - Counts and indices are int32_t, slots int64_t (vLLM's types). Arrays are row-major and dense unless a
 *    stride is given; strides are in elements.
 *  - Every pointer must be aligned as its element type needs (an int32_t array to 4 bytes, a struct to its
 *    alignment; a void buffer to its dtype's element size, see uattn_tensors). A misaligned one is refused
 *    with UATTN_ERR_INVALID_ARGUMENT, never accessed.
 *  - A plan is used by one thread at a time; distinct plans may be used from distinct threads.
 */
#ifndef UATTN_H
#define UATTN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define UATTN_VERSION_MAJOR 0
#define UATTN_VERSION_MINOR 1
#define UATTN_VERSION_PATCH 0

#if defined(_WIN32)
#define UATTN_API
#else
#define UATTN_API __attribute__((visibility("default")))
#endif

/* ------------------------------------------------------------------------------------------------ */
/* Status and errors                                                                                */
/* ------------------------------------------------------------------------------------------------ */

typedef enum uattn_status {
  UATTN_OK = 0,
  UATTN_ERR_INVALID_ARGUMENT = 1, /* a null pointer, a negative or zero count where none can be */
  UATTN_ERR_OUT_OF_RANGE = 2,     /* an index past its array: block id, position past a table row */
  UATTN_ERR_INCONSISTENT = 3,     /* inputs that contradict each other, e.g. a broken block table */
  UATTN_ERR_CAPACITY = 4,         /* more than the limits the object was created with */
  UATTN_ERR_OVERFLOW = 5,         /* a count or product that does not fit its integer type */
  UATTN_ERR_TOO_LARGE = 6,        /* a tensor above a caller-set byte limit: refused, not attempted */
  UATTN_ERR_NO_MEMORY = 7,
  UATTN_ERR_UNSUPPORTED = 8,
} uattn_status;

/* The message of the last failed call on this thread ("" if none). Valid until this thread's next call. */
UATTN_API const char *uattn_last_error(void);
/* A constant name for a status, e.g. "UATTN_ERR_OUT_OF_RANGE". */
UATTN_API const char *uattn_status_name(uattn_status status);
/* "MAJOR.MINOR.PATCH" of the library actually linked. */
UATTN_API const char *uattn_version(void);

/* Optional allocator for every buffer a plan owns. Both or neither may be given. alloc returns memory
 * aligned to at least 64 bytes or NULL. */
typedef struct uattn_allocator {
  void *(*alloc)(void *user, size_t bytes);
  void (*free)(void *user, void *ptr);
  void *user;
} uattn_allocator;

/* ------------------------------------------------------------------------------------------------ */
/* Bucketing: padding a step to static shapes (the seed's buckets, for engines that need them)      */
/* ------------------------------------------------------------------------------------------------ */

/* A batch shape. query_len: query tokens; shared_blocks: distinct shared context blocks; unique_blocks:
 * the seed's unique dimension (largest unique block id + 1); logits: sampled positions. */
typedef struct uattn_bucket {
  int32_t query_len;
  int32_t shared_blocks;
  int32_t unique_blocks;
  int32_t logits;
} uattn_bucket;

/* A custom policy: given the batch's exact shape and whether it holds prompts (needs the causal part),
 * write the padded shape (each dimension >= the batch's) to *out. Return UATTN_OK or an error status. */
typedef uattn_status (*uattn_bucket_fn)(void *user, bool contains_prompts, const uattn_bucket *exact,
                                        uattn_bucket *out);
/* Data-parallel padding added to each padded dimension (the seed's get_dp_padding_fn); >= 0. */
typedef int32_t (*uattn_dp_padding_fn)(void *user, int32_t padded_size);

typedef enum uattn_bucketing_mode {
  UATTN_BUCKETING_NONE = 0,   /* padded shape = exact shape */
  UATTN_BUCKETING_SEED = 1,   /* the seed's exponential ranges and filters */
  UATTN_BUCKETING_CUSTOM = 2, /* call uattn_bucketing.fn */
} uattn_bucketing_mode;

typedef struct uattn_bucketing {
  uattn_bucketing_mode mode;
  uattn_bucket_fn fn; /* CUSTOM only */
  void *fn_user;
  uattn_dp_padding_fn dp_padding; /* optional, any mode */
  void *dp_padding_user;
} uattn_bucketing;

/* A range built the seed's way from (min, max, round_up): 0 is included and min becomes 1 when min is 0;
 * ten points min*(max/min)^(i/9), each rounded up to round_up (the last one is max), deduplicated, sorted.
 * Writes up to cap values to out and their count to *count. */
UATTN_API uattn_status uattn_bucket_range(int32_t min, int32_t max, int32_t round_up, int32_t *out, int32_t cap,
                                          int32_t *count);

/* ------------------------------------------------------------------------------------------------ */
/* The unified-batch planner (the seed's create_unified_batch)                                      */
/* ------------------------------------------------------------------------------------------------ */

typedef struct uattn_plan uattn_plan;

typedef struct uattn_plan_config {
  int32_t block_size;             /* tokens per KV block, > 0 */
  int32_t num_blocks;             /* blocks in the KV cache; block ids are in [0, num_blocks) */
  int32_t max_num_seqs;           /* requests per step */
  int32_t max_num_batched_tokens; /* query tokens per step */
  int32_t max_model_len;          /* positions per request */
  int32_t chunk_size;             /* shared blocks per chunk of chunked shared attention; 0 = whole */
  uattn_bucketing bucketing;
  /* Materializing the seed-format shared bias above this many bytes is refused (UATTN_ERR_TOO_LARGE).
   * 0 means the default, 256 MiB. */
  size_t shared_bias_byte_limit;
  const uattn_allocator *allocator; /* NULL: malloc-based */
  /* Split-K for long decodes: a decode (or verification of up to 15 drafts) whose context reaches
   * split_min_keys keys is computed as ranges of split_keys keys in parallel and merged in a fixed order.
   * Decided by the context, never by the thread count: results do not depend on it. 0 = the defaults,
   * 8192 and 4096. */
  int32_t split_min_keys;
  int32_t split_keys;
  /* Context parallelism (vLLM's decode context parallelism): the KV cache of every request is spread over
   * cp_size ranks, and this plan is rank cp_rank's view of the step. With N = cp_size and I = cp_interleave,
   * position p of a request lives on rank (p / I) % N at local position (p / (I * N)) * I + p % I: runs of I
   * positions dealt to the ranks in turn. The step passed to uattn_plan_step keeps the step's global counts
   * (num_computed, num_scheduled, num_prompt, drafts) while its block table is the rank's own, over local
   * positions. The plan writes only the rank's share of this step's tokens (slot_mapping -1 for the others)
   * and every query row attends to the local keys at the global positions it may see; uattn_forward gives
   * the partial output and its lse (a row with no local key: zeros, lse -inf), and uattn_merge_states of
   * the ranks' partials in rank order is the whole attention. q, k and v are the step's, whole, on every
   * rank. Sinks count on rank 0 only. Cross attention spreads the encoder keys the same way:
   * uattn_cross.encoder_lens stay global, its block table is the rank's own over local positions. ALiBi
   * needs true distances between positions that are not evenly spaced on a rank: with cp_size > 1 its
   * kernel calls take runs of keys whose positions are (at most cp_interleave keys, a slower path). 0 means
   * the defaults: cp_size 1, cp_rank 0, cp_interleave 1; cp_size 1 plans exactly as without these fields. */
  int32_t cp_size;
  int32_t cp_rank;
  int32_t cp_interleave;
} uattn_plan_config;

/* A config with the given cache geometry and limits and defaults for the rest (no bucketing). */
UATTN_API uattn_plan_config uattn_plan_config_default(int32_t block_size, int32_t num_blocks, int32_t max_num_seqs,
                                                      int32_t max_num_batched_tokens, int32_t max_model_len);

/* One step's scheduler state. Request r owns block_table[r * block_table_stride + i], i < stride. */
typedef struct uattn_step {
  int32_t num_reqs;
  const int32_t *num_computed;  /* [num_reqs] tokens already in the cache */
  const int32_t *num_scheduled; /* [num_reqs] new tokens this step (replaced for spec-decode requests) */
  const int32_t *num_prompt;    /* [num_reqs] prompt length */
  const int32_t *block_table;   /* [num_reqs, block_table_stride] */
  int32_t block_table_stride;
  /* Optional: every request's token ids by position, [num_reqs, token_ids_stride]; this step's ids are
   * gathered from it. */
  const int32_t *token_ids;
  int32_t token_ids_stride;
  /* Optional spec-decode drafts, CSR: request r's drafts are draft_tokens[draft_offsets[r] ..
   * draft_offsets[r+1]). A request with at least one entry is a spec-decode request and its num_scheduled
   * becomes (entries != -1) + 1: -1 entries are placeholders and do not count (as in the seed). */
  const int32_t *draft_tokens;
  const int32_t *draft_offsets; /* [num_reqs + 1] or NULL; >= 0 and non-decreasing */
  /* Async scheduling (the seed's rule): when exactly one request samples nothing (a prompt that is still
   * partial), its last token is sampled anyway and the request is reported in invalid_req_indices. */
  bool async_scheduling;
} uattn_step;

UATTN_API uattn_status uattn_plan_create(const uattn_plan_config *config, uattn_plan **out);
UATTN_API void uattn_plan_destroy(uattn_plan *plan);

/* Plans one step. The plan keeps its buffers between steps: once it has seen its largest batch, this call
 * allocates nothing. On an error the plan still holds the previous step. */
UATTN_API uattn_status uattn_plan_step(uattn_plan *plan, const uattn_step *step);

/* A shared context block and the run of query tokens of one request that read it. A token t of the run
 * sees usage = clamp(token_context_lens[t] - block_start, 0, block_size) keys of the block: per token, so
 * the tokens of a multi-token decode stay causal. */
typedef struct uattn_shared_span {
  int32_t shared_index; /* index into shared_blocks */
  int32_t req;
  int32_t block_start; /* position of the block's first key in the request */
  int32_t token_begin; /* first query row of the run */
  int32_t token_end;   /* one past the last query row */
} uattn_shared_span;

/* A context block read by exactly one query token. */
typedef struct uattn_unique_block {
  int32_t block;       /* block id */
  int32_t token;       /* the query row that reads it */
  int32_t block_start; /* position of the block's first key in the request */
  int32_t usage;       /* keys of the block the token sees, 1..block_size */
} uattn_unique_block;

/* Everything planned for the step. Pointers stay valid until the plan's next step or destruction. Arrays
 * of length num_tokens are indexed by query row. */
typedef struct uattn_plan_info {
  int32_t block_size;
  int32_t num_reqs;
  int32_t num_tokens;
  bool contains_prompts;

  /* per request */
  const int32_t *num_scheduled;     /* [num_reqs] after the spec-decode rule */
  const int32_t *query_start_loc;   /* [num_reqs + 1] */
  const int32_t *seq_lens;          /* [num_reqs] num_computed + num_scheduled */
  const bool *is_prompt;            /* [num_reqs] seq_len <= num_prompt */
  const int32_t *num_output_tokens; /* [num_reqs] sampled positions of each request */

  /* per query row */
  const int32_t *token_groups;    /* request of the row */
  const int32_t *token_offsets;   /* row - query_start_loc[request] */
  const int32_t *token_positions; /* absolute position */
  const int32_t *token_ids;       /* NULL when the step gave none */
  const int64_t *slot_mapping;    /* cache slot this row's K/V is written to; -1: another CP rank's token */
  /* keys of the row read from the cache: min(position + 1, cached) where cached is num_computed for a
   * prompt (its new keys come from the causal part) and seq_len otherwise (its keys are in the cache); with
   * context parallelism the rank's share of them, a count of local positions */
  const int32_t *token_context_lens;
  /* The causal part: a row of a prompt request reads this step's keys of its request up to and including
   * its own row; a row of any other request reads none (all its keys are in the cache). */

  /* sampling */
  int32_t num_logits;
  const int32_t *logits_indices;      /* [num_logits] query rows to sample */
  const int32_t *logits_groups;       /* [num_logits] their requests */
  const int32_t *new_token_positions; /* [num_logits] */
  int32_t num_invalid_reqs;
  const int32_t *invalid_req_indices; /* [num_invalid_reqs] */

  /* context split */
  int32_t num_shared_blocks;
  const int32_t *shared_blocks; /* [num_shared_blocks] sorted block ids read by more than one token */
  int32_t num_shared_spans;
  const uattn_shared_span *shared_spans; /* sorted by (shared_index, req) */
  int32_t num_unique_blocks;
  const uattn_unique_block *unique_blocks; /* sorted by (token, block_start) */

  /* bucketing */
  uattn_bucket exact;   /* the batch's own shape */
  uattn_bucket padded;  /* the shape after bucketing and data-parallel padding */
  bool bucket_fallback; /* no bucket fitted: padded to the exact shape */
} uattn_plan_info;

UATTN_API uattn_status uattn_plan_get_info(const uattn_plan *plan, uattn_plan_info *info);

/* Counters over the plan's life. */
typedef struct uattn_plan_stats {
  int64_t steps;
  int64_t bucket_fallbacks; /* steps that fit no bucket */
  int64_t allocations;      /* buffer (re)allocations, creation included */
  size_t bytes_reserved;    /* bytes the plan holds */
} uattn_plan_stats;

UATTN_API uattn_status uattn_plan_get_stats(const uattn_plan *plan, uattn_plan_stats *stats);

/* The seed's bucket list for this plan's config (UATTN_BUCKETING_SEED), sorted. Writes the list and its
 * length to *count (buckets NULL and cap 0: only the length); causal[i], when given, says whether bucket i
 * is for batches with prompts. The logits of each bucket are max_num_seqs. */
UATTN_API uattn_status uattn_plan_buckets(const uattn_plan *plan, uattn_bucket *buckets, bool *causal, int32_t cap,
                                          int32_t *count);

/* Seed-format tensors, padded to the plan's padded bucket with the seed's pad values (-1 for ids and
 * block mappings, -inf for biases; 0.0 means visible). Built on request by uattn_plan_materialize. */
typedef enum uattn_seed_tensor {
  UATTN_SEED_CAUSAL_BIAS = 1 << 0,  /* float [tq, tq] */
  UATTN_SEED_SHARED_BIAS = 1 << 1,  /* float [tq, ts, bs] */
  UATTN_SEED_SHARED_USAGE = 1 << 2, /* int32 [tq, ts], PR 784's dense usage table, 0 = masked */
  UATTN_SEED_UNIQUE_BIAS = 1 << 3,  /* float [tu, bs] and int32 unique block mapping [tu] */
  UATTN_SEED_PADDED_IDS = 1 << 4,   /* int64 slot mapping [tq], int32 token ids/positions [tq], logits [tl] */
} uattn_seed_tensor;

typedef struct uattn_seed_tensors {
  uattn_bucket shape;                  /* the padded bucket: tq, ts, tu, tl */
  const float *causal_bias;            /* [tq, tq] */
  const float *shared_bias;            /* [tq, ts, bs] */
  const int32_t *shared_usage;         /* [tq, ts] */
  const float *unique_bias;            /* [tu, bs] */
  const int32_t *unique_block_mapping; /* [tu] the query row reading block id i, -1 if none */
  const int64_t *slot_mapping;         /* [tq] */
  const int32_t *token_ids;            /* [tq] (-1 padding; all -1 when the step gave no ids) */
  const int32_t *token_positions;      /* [tq] */
  const int32_t *logits_indices;       /* [tl] */
} uattn_seed_tensors;

/* Builds the requested tensors (an OR of uattn_seed_tensor) for the current step. Semantics follow uattn,
 * not the seed's two defects: decode rows get nothing from the causal bias (their keys are in the cache)
 * and usages are per token. A shared bias above the plan's byte limit is refused. */
UATTN_API uattn_status uattn_plan_materialize(uattn_plan *plan, unsigned what, uattn_seed_tensors *out);

/* ------------------------------------------------------------------------------------------------ */
/* The runtime: threads pinned to cores, created once by an engine                                  */
/* ------------------------------------------------------------------------------------------------ */
/* BEGIN runtime */
typedef struct uattn_runtime uattn_runtime;

/* Workers whose placement uattn_topology lists; a runtime may have more (up to UATTN_RUNTIME_MAX_THREADS). */
#define UATTN_TOPOLOGY_MAX_WORKERS 256
/* The most workers one runtime may have. */
#define UATTN_RUNTIME_MAX_THREADS 1024

/* How a runtime places its threads. Start from uattn_runtime_config_default().
 *
 * Precedence, field by field: an explicit value in the config wins; else the environment variable; else the
 * default. "Explicit" means num_threads != 0 and cpuset non-NULL and non-empty. An environment variable that
 * is set but malformed fails uattn_runtime_create (UATTN_ERR_INVALID_ARGUMENT, naming the variable) rather
 * than being ignored, since a silently ignored setting is the harder bug to find.
 *  - UATTN_NUM_THREADS  workers, a decimal integer in [0, UATTN_RUNTIME_MAX_THREADS]; 0 = the default.
 *  - UATTN_CPUSET       PUs the runtime may use, same syntax as cpuset below.
 *
 * The calling thread of uattn_runtime_run is worker 0: it is the engine's own thread, so it is only bound
 * when pin_caller says so. Unbound, it may find itself on a pinned worker's PU, where the two would share one
 * CPU for the whole call (Linux does not move either in time: a 2-thread decode then ran at one thread's
 * speed); each call then moves it to caller_pu (uattn_topology) where its binding allows, by binding it to
 * that PU and at once giving it back its binding, so the thread's binding is never changed. A thread whose
 * binding excludes caller_pu stays where it is. Workers 1.. are threads the runtime creates. With pin, worker k is bound to the
 * first usable PU of usable core k mod (usable cores), one worker per core and not per SMT sibling, so worker
 * 0's core is left to the caller. More workers than usable cores is allowed: they then share cores
 * round-robin (uattn_topology.oversubscribed says so). Without pin, workers may run on any usable PU.
 *
 * "The process's binding" is hwloc's: the union of the bindings of all its threads when the runtime is
 * created. taskset, or sched_setaffinity before other threads start, restricts it; one thread binding itself
 * while others stay unbound does not.
 *
 * Idle workers spin for spin_us microseconds after a job, then sleep in the kernel (a futex) until the next
 * one: back-to-back calls cost well under a microsecond, and nothing spins on the engine's cores for longer
 * than spin_us between calls. Waking a sleeping worker costs the OS's wake-up latency (tens of microseconds
 * on a VM). Inside uattn_runtime_run the caller waits for the workers by spinning (pause for spin_us, then
 * sched_yield) rather than sleeping, since it is its own core and a wake-up would cost more than the job; with
 * spin_us == 0 it sleeps too. */
typedef struct uattn_runtime_config {
  int32_t num_threads; /* workers, worker 0 included; 0 = $UATTN_NUM_THREADS, else one per usable core */
  /* OS indices of the PUs the runtime may use, like taskset -c: "0-3,8" (ranges "a-b" with a <= b, single
   * indices, separated by single commas). Every PU must lie in the process's binding (sched_setaffinity,
   * taskset, cgroups), else creation fails with UATTN_ERR_OUT_OF_RANGE. NULL or "" = $UATTN_CPUSET, else
   * the whole binding. Read during creation only. */
  const char *cpuset;
  bool pin; /* bind each worker 1.. to its own core (default true) */
  /* Also bind the thread that calls uattn_runtime_create to worker 0's PU (caller_pu) for the runtime's
   * life; uattn_runtime_destroy, called from that same thread, gives it back its previous binding. Default
   * false: the engine's thread is left as it is. Note that while a process's only thread is pinned, the
   * process's binding is that one PU, and a runtime created then sees one core. */
  bool pin_caller;
  int32_t spin_us; /* idle spin before sleeping, in [0, 1000000]; 0 = sleep at once; default 50 */
  /* Optional: the runtime's own memory and the workers' scratch (hwloc's topology and the runtime's
   * copy of it use malloc). The hooks are called from the worker threads, concurrently: they must be
   * thread-safe. NULL = malloc-based. */
  const uattn_allocator *allocator;
} uattn_runtime_config;

/* num_threads 0, cpuset NULL, pin true, pin_caller false, spin_us 50, allocator NULL. */
UATTN_API uattn_runtime_config uattn_runtime_config_default(void);

/* Loads the machine's topology (hwloc), intersects it with the process's binding and the cpuset, starts the
 * workers and waits until each has bound itself: about 10 ms on a 2-vCPU VM, mostly hwloc's discovery of
 * the machine. config NULL = the defaults (environment included). An engine creates one runtime and keeps
 * it; several runtimes may coexist (each has its own threads, which then share cores). */
UATTN_API uattn_status uattn_runtime_create(const uattn_runtime_config *config, uattn_runtime **out);
/* Stops and joins the workers and frees everything. No call on rt may be running. NULL is a no-op. */
UATTN_API void uattn_runtime_destroy(uattn_runtime *rt);

/* Counts of one part of the machine. */
typedef struct uattn_topology_counts {
  int32_t packages;   /* 0 when hwloc does not know */
  int32_t numa_nodes; /* with at least one PU there; the machine's count includes memory-only nodes */
  int32_t cores;      /* physical cores */
  int32_t pus;        /* hardware threads (logical CPUs) */
} uattn_topology_counts;

/* What the runtime found and how it placed its workers. */
typedef struct uattn_topology {
  uattn_topology_counts machine; /* the whole machine as hwloc sees it */
  uattn_topology_counts binding; /* within the process's binding (taskset, sched_setaffinity, cgroups) */
  uattn_topology_counts usable;  /* within the binding and the runtime's cpuset: what the workers use */
  /* Data cache sizes in bytes as hwloc reports them for the first usable core; 0 if unknown. L1d and L2
   * are usually per core, L3 shared by several cores (l3_cores of them within the machine). */
  size_t l1d_bytes;
  size_t l2_bytes;
  size_t l3_bytes;
  int32_t l3_cores;
  int32_t num_workers;
  bool pinned;         /* config.pin */
  bool oversubscribed; /* more workers than usable cores: some share a core */
  /* The PU of worker 0's core, which no other worker takes unless oversubscribed: an engine that pins its
   * own thread (the caller of uattn_runtime_run) should put it there. An unpinned caller found on a
   * worker's PU is moved there by each call (see uattn_runtime_config). */
  int32_t caller_pu;
  /* For each worker (the first UATTN_TOPOLOGY_MAX_WORKERS): the OS index of the PU it is bound to and that
   * PU's NUMA node (OS index); -1 for an unbound worker (worker 0 without pin_caller; all without pin). */
  int32_t worker_pu[UATTN_TOPOLOGY_MAX_WORKERS];
  int32_t worker_numa[UATTN_TOPOLOGY_MAX_WORKERS];
} uattn_topology;

UATTN_API uattn_status uattn_runtime_get_topology(const uattn_runtime *rt, uattn_topology *out);
/* END runtime */

/* ------------------------------------------------------------------------------------------------ */
/* KV cache memory                                                                                  */
/* ------------------------------------------------------------------------------------------------ */

/* Zeroed memory for a KV cache, on 2 MiB pages where the system gives them: `bytes` rounded up to whole
 * 2 MiB pages, 2 MiB-aligned, and asked for transparent huge pages (madvise MADV_HUGEPAGE: honoured under
 * the THP settings "always" and "madvise"; under "never" the memory is on 4 KiB pages and works the same).
 * Why: a step's decodes read their blocks wherever they lie in the cache, and on 4 KiB pages every 4 KiB
 * read is a TLB miss and a page walk. Measured on this project's Zen 3 VM over a 256 MiB cache: the decode
 * kernel 3-20% faster, a plain read 10-30%. Any cache memory works with uattn_forward; this is only faster.
 * Pages are placed by the first thread that writes them (the kernel's first-touch rule). Free with
 * uattn_cache_free and the same bytes. */
UATTN_API uattn_status uattn_cache_alloc(size_t bytes, void **out);
/* uattn_cache_alloc's memory with its pages interleaved over the NUMA nodes of rt's cores (page i on node
 * i mod n, as the kernel's MPOL_INTERLEAVE places them when first touched), instead of on the node of
 * whichever thread writes them first. On a machine of several nodes the forward hands KV head g to the
 * workers of node g % n first, but every worker reads blocks all over the cache: interleaved, the reads
 * draw on every node's memory controllers, where first touch by one engine thread would put the whole cache
 * behind one node's. With one node the pages go to that node. The system may refuse a placement policy (a
 * container's seccomp profile may forbid mbind): UATTN_ERR_UNSUPPORTED, and nothing is kept; use
 * uattn_cache_alloc then. Free with uattn_cache_free and the same bytes. */
UATTN_API uattn_status uattn_runtime_cache_alloc(const uattn_runtime *rt, size_t bytes, void **out);
/* Frees what uattn_cache_alloc or uattn_runtime_cache_alloc(.., bytes, ...) returned. NULL is a no-op. */
UATTN_API void uattn_cache_free(void *ptr, size_t bytes);

/* ------------------------------------------------------------------------------------------------ */
/* Attention over a planned step                                                                    */
/* ------------------------------------------------------------------------------------------------ */

typedef enum uattn_dtype {
  UATTN_F32 = 0,
  UATTN_BF16 = 1, /* the upper 16 bits of an IEEE fp32 */
  UATTN_F16 = 2,  /* IEEE binary16 */
  /* 8-bit floats, for KV caches only (uattn_layer.cache_dtype; q, k, v and out stay f32/bf16/f16). A cache
   * holds fp8(x / scale) of each value x, scale the layer's k_scale or v_scale, rounded to nearest even and
   * saturated to the largest finite value (infinities too); NaN stays NaN (S.1111.111 in both). Every read
   * uses fp8 * scale in fp32, of every key and value, this step's own included (uattn_forward). */
  UATTN_FP8_E4M3 = 3, /* the "fn" variant: 4 exponent bits (bias 7), 3 mantissa bits, no infinities, max 448 */
  UATTN_FP8_E5M2 = 4, /* 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like, max finite 57344 */
} uattn_dtype;

typedef enum uattn_kv_layout {
  UATTN_LAYOUT_NHD = 0, /* [num_blocks * block_size, num_kv_heads, head_dim] */
  UATTN_LAYOUT_HND = 1, /* [num_blocks, num_kv_heads, block_size, head_dim] */
  /* uattn's own, for the decode kernels with bf16 dot products: each block in tiles of 16 keys, each tile
   * every KV head in turn, keys transposed into dim pairs and values interleaved in key pairs, so that one
   * 64-byte line of bf16 holds one dim pair of 16 keys (16 scores a vdpbf16ps) or 16 dims of a key pair (P V
   * without reordering). Key i of tile t of block b is slot b * block_size + 16 t + i; dim d = 2 p + e:
   *   key_cache   [num_blocks, block_size / 16, num_kv_heads, head_dim / 2, 16, 2]: element (b, t, h, p, i, e)
   *   value_cache [num_blocks, block_size / 16, num_kv_heads, 8, head_dim, 2]:      element (b, t, h, i / 2, d, i % 2)
   * The same bytes as NHD and HND (fp8 caches: one code an element), written by uattn_forward's cache write;
   * an engine allocates it like the others and leaves its contents to uattn. Needs a block size that is a
   * multiple of 16 and an even head dim. Where the CPU has AVX512-BF16 its decodes are the fastest of the three
   * layouts (1.1-1.3x NHD's on this project's Zen 4), its prefill-like parts 2-9% slower: a layout for
   * decode-heavy serving. Elsewhere its blocks are gathered into rows. Measured: docs/performance.md. */
  UATTN_LAYOUT_TILED = 2,
} uattn_kv_layout;

/* Which keys a query sees (vLLM's attention types). */
typedef enum uattn_attention_type {
  UATTN_ATTENTION_DECODER = 0,         /* causal self-attention over the decoder's KV cache */
  UATTN_ATTENTION_ENCODER = 1,         /* bidirectional self-attention of an encoder-decoder's encoder */
  UATTN_ATTENTION_ENCODER_ONLY = 2,    /* bidirectional self-attention of an encoder-only model */
  UATTN_ATTENTION_ENCODER_DECODER = 3, /* cross-attention: decoder queries, encoder keys */
} uattn_attention_type;

/* One attention layer. Query head h reads KV head h / (num_q_heads / num_kv_heads). */
typedef struct uattn_layer {
  int32_t num_q_heads, num_kv_heads, head_dim;
  float scale;             /* score = scale * <q, k> */
  float soft_cap;          /* > 0: score = soft_cap * tanh(score / soft_cap) */
  int32_t sliding_window;  /* > 0: a query at p sees keys j > p - sliding_window */
  uattn_dtype dtype;       /* of q, k, v and out */
  uattn_dtype cache_dtype; /* of the key and value caches, which the attention reads every key as (uattn_forward) */
  uattn_kv_layout kv_layout;
  uattn_attention_type attn_type;
  const float *sinks;        /* optional [num_q_heads]: a logit that enters each head's denominator only */
  const float *alibi_slopes; /* optional [num_q_heads]: score += slope * (key position - query position) */
  int32_t causal_width;      /* query rows per tile (the seed's causal slice); 0 = 64 x num_kv_heads, at most
                              * the seed's 512 (fewer KV heads: smaller tiles, so a prompt is work for
                              * several workers; forward.c's default_query_tile says what it was chosen on) */
  int32_t chunk_size;        /* shared blocks per chunk with an online-softmax merge (PR 784); 0 = whole */
  /* Kernels with bf16 dot products (the avx512bf16 level: bf16 layers on bf16 caches) multiply P V with P
   * rounded to bf16 (relative error 2^-9 each, accumulated in fp32), as vLLM's AMX path and PyTorch's CPU
   * flash attention do: the default (false); the output moves by up to 2^-9 of the weighted |v| (measured
   * against fp64 on tests/attention/test_attention.c's bf16 cases: 0.0029-0.0044 of the largest output, against
   * 0.0020-0.0035 with P in fp32, both mostly the bf16 output's own rounding). true keeps P in fp32 there
   * (fp32 FMAs with V widened: the other levels' arithmetic for that product). Other levels always keep P
   * in fp32. */
  bool probs_fp32;
  /* fp8 caches only (ignored otherwise): the per-layer scales of the keys and the values, finite and > 0
   * (uattn_layer_default: 1). The cache write stores fp8(k / k_scale) and fp8(v / v_scale); the attention
   * reads fp8 * k_scale and fp8 * v_scale for every key and value, this step's own included: a prompt row
   * sees its own step's keys quantized as a later step will (uattn_forward). */
  float k_scale, v_scale;
} uattn_layer;

/* A layer with the given heads and dtype, scale 1/sqrt(head_dim), NHD layout, decoder attention. */
UATTN_API uattn_layer uattn_layer_default(int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
                                          uattn_dtype dtype);

/* Encoder-decoder cross attention: request r's queries see all encoder_lens[r] keys of a separate paged
 * sequence, stored in the caches passed as key_cache/value_cache, through cross_block_table (its own
 * block size is the plan's). This step's k and v are not written. */
typedef struct uattn_cross {
  const int32_t *encoder_lens; /* [num_reqs] */
  const int32_t *block_table;  /* [num_reqs, block_table_stride] */
  int32_t block_table_stride;
} uattn_cross;

/* The tensors of one forward call. q [T, Hq, D], k and v [T, Hkv, D] and out [T, Hq, D] are dense in the
 * layer's dtype (T = the plan's num_tokens); the caches are in cache_dtype and kv_layout. Every buffer must
 * be aligned to its element size: q, k, v and out to the dtype's (2 bytes for bf16 and f16, 4 for f32),
 * the caches to cache_dtype's, lse and the layer's sinks and alibi_slopes to 4, the cross arrays to 4. The
 * kernels load and store whole elements, so a misaligned buffer is refused (UATTN_ERR_INVALID_ARGUMENT)
 * before anything is written; so is a cache or a q whose size in bytes overflows a size_t
 * (UATTN_ERR_OVERFLOW). */
typedef struct uattn_tensors {
  const void *q, *k, *v;
  void *key_cache, *value_cache;
  int32_t num_blocks; /* blocks in each cache; every slot the plan writes or reads must be inside */
  int32_t block_size; /* the caches' block size: must be the plan's */
  void *out;
  float *lse;               /* optional [T, Hq]: natural-log sum of exp of each row's scores (sinks included) */
  const uattn_cross *cross; /* encoder-decoder only */
  /* true: out is fp32 [T, Hq, D] whatever the layer's dtype, the fp32 result before its one rounding to the
   * dtype. For partial results that uattn_merge_states will merge (several calls over disjoint keys, the
   * ranks of context parallelism), so that the merge adds no rounding of its own. */
  bool out_f32;
} uattn_tensors;

/* Writes this step's k and v into the caches at the plan's slot mapping, then computes attention for every
 * query row (docs/design.md): the causal, shared and unique parts of the seed, merged with its fmin/feps
 * guards, with fp32 accumulation. Every key and value is read as the cache holds it (in cache_dtype; fp8
 * times k_scale or v_scale), this step's own included, by every row: a decode or verification row reads its
 * new keys back from the cache, a prompt row reads this step's keys from k/v rounded to cache_dtype by the
 * cache write's own conversion (the same bits, slot or not). So a key has one value in its own step and in
 * every later one, as in vLLM's backends, which write the cache first and read every key from it; on a bf16
 * or f16 cache under f32 (or the other 16-bit) queries the same rule rounds the step's keys to the cache
 * dtype, and on a cache as wide as the inputs (the same dtype, or f32) it reads k and v as given.
 * A row with no visible key gets zeros (lse -inf). On an error nothing has been written to the caches or
 * the outputs. rt: the threads to run on (NULL: the calling thread); the result is bitwise the same for
 * any number of threads. */
UATTN_API uattn_status uattn_forward(const uattn_plan *plan, const uattn_layer *layer, const uattn_tensors *t,
                                     uattn_runtime *rt);

/* The name of the generic kernel set uattn_forward runs on this CPU when no generated bucket fits
 * ("avx512bf16", "avx512", "avx2", "portable"), and in *why (when not NULL) how it was chosen: the best set the
 * CPU runs, or the one the environment variable UATTN_ISA names. UATTN_ISA names the highest level to use, not
 * one to force on every layer: each layer takes the best level at or below it that keeps the layer's precision.
 * avx512bf16 rounds its inputs to bf16, so it serves bf16 queries on bf16 or fp8 caches (exact in bf16) and an
 * f32 or f16 layer takes the avx512 level below it, UATTN_ISA=avx512bf16 or not (uattn_describe_kernels says
 * which level a layer gets, and why). A level the CPU lacks gives the best one below it; UATTN_TWINS=1 (the
 * test suites set it) runs that level's exact twin instead, which computes its bits on any AVX2 CPU, slowly. */
UATTN_API const char *uattn_kernel_set(const char **why);

/* The parts of the attention (docs/design.md), each served by its own kernel entry. */
typedef enum uattn_part {
  UATTN_PART_CAUSAL = 0, /* prompt rows against this step's keys */
  UATTN_PART_SHARED = 1, /* context blocks several rows read; cross attention's encoder keys */
  UATTN_PART_UNIQUE = 2, /* context blocks one row reads (decodes) */
  UATTN_NUM_PARTS = 3,
} uattn_part;

/* A kernel bucket generated at build time (the build option UATTN_KERNEL_BUCKETS lists them): kernels
 * specialized for one cache dtype, block size, head dim and shared-part chunk size. */
typedef struct uattn_kernel_bucket {
  int32_t block_size, head_dim;
  uattn_dtype dtype;  /* of the cache */
  int32_t chunk_size; /* the layer's chunk_size it serves (0 = whole shared part) */
  const char *isa;    /* "avx2", "avx512" (its decode kernel; the other parts are the avx2 bucket's) */
  bool runs_here;     /* this CPU has the ISA */
} uattn_kernel_bucket;

/* Copies up to capacity of the generated buckets into out (out may be NULL when capacity is 0) and returns
 * how many there are. A capacity <= 0 or a NULL out copies nothing. */
UATTN_API int32_t uattn_kernel_buckets(uattn_kernel_bucket *out, int32_t capacity);

/* Which kernels serve a layer, and why. */
typedef struct uattn_kernel_report {
  /* the kernel bucket the layer asks for: the caches' block size, the head dim, the cache dtype and the
   * chunk size (the layer's, or the tuning file's when the layer leaves it 0) */
  int32_t block_size, head_dim;
  uattn_dtype cache_dtype;
  int32_t chunk_size;
  bool bucket_hit;        /* a generated bucket serves it; else a generic set (a fallback) */
  const char *kernel_set; /* the set whose code runs: "avx512", "avx2", "portable" */
  /* per part, the function that attends: a bucket's own (uattn_bf16_unique_b128_d128_c0__avx2), or the
   * generic set's name */
  char part_kernel[UATTN_NUM_PARTS][64];
  /* the function that reads a few rows' keys straight from the cache, without panels ("" when the set has
   * none): decodes' unique blocks, and on an NHD or TILED cache every block of a decode or a short
   * verification. On a TILED cache: the set's kernel for that layout, or, where it has none for the layer,
   * its decode kernel followed by " (gathered)": the blocks are copied into rows first. */
  char decode_kernel[64];
  /* On a TILED cache: whether the panel loads (every part but the decode kernel's) copy the blocks into rows
   * first, the set having no load for that layout or the cache being f16 or f32. false on NHD and HND. */
  bool panels_gathered;
  char reason[192]; /* "generated bucket" or, for a fallback, what is missing and what serves instead */
  /* uattn_last_forward_report only (0 in uattn_describe_kernels): the kernel jobs each part got (0 = the
   * step had none of that part; a decode call over several KV heads is a job a head) and, of those, the
   * decode kernel's; the scratch each worker used; the workers */
  int64_t part_calls[UATTN_NUM_PARTS];
  int64_t decode_calls[UATTN_NUM_PARTS];
  size_t workspace_bytes;
  int32_t workers;
} uattn_kernel_report;

/* Which kernels uattn_forward would use for this layer over caches of block_size. */
UATTN_API uattn_status uattn_describe_kernels(const uattn_layer *layer, int32_t block_size, uattn_kernel_report *out);
/* What served the last successful uattn_forward called from this thread (UATTN_ERR_INVALID_ARGUMENT when
 * this thread has run none). */
UATTN_API uattn_status uattn_last_forward_report(uattn_kernel_report *out);

/* Merges partial attention results of the same rows computed over disjoint key sets (several calls, or
 * ranks of context parallelism): out = sum_i out_i * exp(lse_i - lse), lse = log(sum_i exp(lse_i)).
 * outs[i] and lses[i] are fp32 [rows, heads, head_dim] and [rows, heads]; out may alias outs[0]. */
UATTN_API uattn_status uattn_merge_states(int32_t num_parts, const float *const *outs, const float *const *lses,
                                          int32_t rows, int32_t heads, int32_t head_dim, float *out, float *lse);

/* The seed's partial form: an unnormalized output sum_j e^(s_j - m) v_j, its row max m and its row sum
 * l = sum_j e^(s_j - m). Merges num_parts of them per (row, head) the seed's way, with fmin (a floor for
 * the max) and feps (a floor for the sum) guards: a row whose parts are all empty gets zeros. */
UATTN_API uattn_status uattn_merge_partials(int32_t num_parts, const float *const *outs, const float *const *maxes,
                                            const float *const *sums, int32_t rows, int32_t heads, int32_t head_dim,
                                            float *out);

/* ------------------------------------------------------------------------------------------------ */
/* vLLM attention-backend batch utilities                                                           */
/* ------------------------------------------------------------------------------------------------ */
/* BEGIN batch utilities */
/*
 * Re-creations, in C, of vLLM's batch helpers (vllm/v1/attention/backends/utils.py and the v0
 * vllm/attention/backends/utils.py). Each names the seed function it re-creates; the seed's results are
 * kept exactly, quirks included (each is noted), except that where the seed asserts or crashes on bad
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

/* The slot of a token whose K/V must not be written (the seed's PAD_SLOT_ID). */
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

/* The seed's split_decodes_and_prefills: in a batch already reordered decodes first, the decodes are the
 * requests before the first one with more than decode_threshold (>= 0) query tokens; the rest are prefills.
 * With require_uniform, a decode must also have the first request's query length (0-length requests
 * count as padding when every other request has that length), so the first request of another length
 * starts the prefills. num_tokens is the seed's num_actual_tokens: qsl[num_reqs], or more when the batch
 * is padded; prefill tokens are num_tokens - qsl[num_decodes]. num_reqs == 0 gives all zeros except
 * num_decode_tokens = num_tokens. A uniform batch whose num_tokens != num_reqs * first query length (the
 * seed's assertion) is UATTN_ERR_INCONSISTENT. */
UATTN_API uattn_status uattn_split_decodes_and_prefills(int32_t num_reqs, const int32_t *query_start_loc,
                                                        int32_t num_tokens, int32_t decode_threshold,
                                                        bool require_uniform, uattn_batch_split *out);

/* The seed's split_decodes_prefills_and_extends: like uattn_split_decodes_and_prefills (no uniform
 * option), then among the non-decodes, the prefills start at the first request with more than
 * decode_threshold query tokens and no context (seq_lens[r] == its query length); the ones before it are
 * extends. seq_lens: [num_reqs], each >= the request's query length. A short (<= decode_threshold) prompt
 * after the first extend counts as an extend, as in the seed. */
UATTN_API uattn_status uattn_split_decodes_prefills_and_extends(int32_t num_reqs, const int32_t *query_start_loc,
                                                                const int32_t *seq_lens, int32_t num_tokens,
                                                                int32_t decode_threshold, uattn_batch_split *out);

/* Exchange the requests at positions a and b. */
typedef struct uattn_swap {
  int32_t a;
  int32_t b;
} uattn_swap;

/* The seed's reorder_batch_to_split_decodes_and_prefills: the swaps that put the batch in decode ->
 * extend -> prefill order, where a prefill has num_computed == 0 (whatever its length), a decode has
 * num_computed > 0 and num_scheduled <= decode_threshold, and an extend is the rest. Applying swaps[0],
 * swaps[1], ... in turn to the batch orders it. Their number is the fewest any sequence of swaps can do
 * (the seed's own sequence is sometimes longer), and at most max(num_reqs - 1, 0), so a capacity of
 * num_reqs always suffices. *num_swaps == 0 is the seed's "False" (batch unchanged). The order within a
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

/* The seed's make_local_attention_virtual_batches (chunked local attention, as in Llama 4): each request
 * is cut at multiples of attn_chunk_size of its positions into virtual batches that attend only within
 * their chunk; a virtual batch's block-table row holds the pages of its chunk. block_table is
 * [num_reqs, block_table_stride] (stride = columns, >= 1; needed only when out->block_table is set);
 * columns past the row are clamped to its last column as in the seed. To rebuild only the block table
 * from a changed block table (the seed's returned make_block_table), call again with only
 * out->block_table set. Seed quirks kept: a request with no query tokens still makes one virtual batch;
 * with seq_len 0 too, that batch claims attn_chunk_size keys and its pages come from the row's last
 * columns (numpy's negative indexing; column 0 where the row is shorter than a chunk, where the seed
 * raises). */
UATTN_API uattn_status uattn_make_local_attention_virtual_batches(int32_t attn_chunk_size, int32_t block_size,
                                                                  int32_t num_reqs, const int32_t *query_start_loc,
                                                                  const int32_t *seq_lens, const int32_t *block_table,
                                                                  int32_t block_table_stride, uattn_local_batches *out);

/* The v0 seed's compute_slot_mapping_start_idx: the first token of a prompt whose K/V is written when a
 * sliding window is in use, max(0, query_len - sliding_window), else 0. sliding_window 0 means none.
 * context_len is checked but unused, as in the seed. */
UATTN_API uattn_status uattn_compute_slot_mapping_start_idx(bool is_prompt, int32_t query_len, int32_t context_len,
                                                            int32_t sliding_window, int32_t *start_idx);

/* The v0 seed's compute_slot_mapping for one sequence: the cache slot of each of its tokens at positions
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

/* The seed's split_prefill_chunks: cuts requests into consecutive chunks, greedily, each as long as its
 * seq_lens sum stays <= workspace_size; every seq_len must be <= workspace_size. Bounds are shifted by
 * request_offset (>= 0). There are at most num_reqs chunks. */
UATTN_API uattn_status uattn_split_prefill_chunks(const int32_t *seq_lens, int32_t num_reqs, int32_t workspace_size,
                                                  int32_t request_offset, uattn_req_range *chunks, int32_t capacity,
                                                  int32_t *num_chunks);

/* The seed's get_dcp_local_seq_lens: how many of each sequence's keys the KV cache of a decode-context-
 * parallel rank holds, keys being dealt to the dcp_size ranks in runs of interleave (>= 1). With dcp_rank
 * in [0, dcp_size): out[r] for that rank (num_reqs values). With dcp_rank == -1 (the seed's None): every
 * rank, out[r * dcp_size + rank] (num_reqs * dcp_size values). */
UATTN_API uattn_status uattn_compute_dcp_local_seq_lens(const int32_t *seq_lens, int32_t num_reqs, int32_t dcp_size,
                                                        int32_t dcp_rank, int32_t interleave, int32_t *out,
                                                        int32_t capacity);

/* Scalars of the fast-prefill metadata (the rest passes through unchanged). */
typedef struct uattn_fast_prefill_info {
  bool unchanged;            /* no request had more than one query token: the seed returns its input */
  int32_t num_actual_tokens; /* rows kept: num_logits (qsl[num_reqs] when unchanged) */
  int32_t max_query_len;     /* most rows kept in one request */
} uattn_fast_prefill_info;

/* The seed's make_kv_sharing_fast_prefill_common_attn_metadata: with KV sharing, only the query rows that
 * are sampled (logits_indices, num_logits of them, each in [0, qsl[num_reqs]), any order) need attention
 * in the later layers; query_start_loc_out ([num_reqs + 1]) counts those rows per request (seq_lens,
 * block table and slot mapping stay as they are). When the longest query is exactly 1 token the input
 * is returned as is (copied) and logits_indices may be NULL. */
UATTN_API uattn_status uattn_make_kv_sharing_fast_prefill_metadata(int32_t num_reqs, const int32_t *query_start_loc,
                                                                   const int32_t *logits_indices, int32_t num_logits,
                                                                   int32_t *query_start_loc_out,
                                                                   uattn_fast_prefill_info *info);

/* The seed's BLOCK_M for causal_conv1d: query tokens per program. */
#define UATTN_CAUSAL_CONV1D_BLOCK_M 8

/* The programs uattn_compute_causal_conv1d_metadata writes (sum of ceil(query length / block_m)), and the
 * length of the seed's pre-padded buffers, 2 * max(1024, num_programs). query_start_loc here is the
 * prefills' own (num_reqs + 1 entries, >= 0, non-decreasing; need not start at 0). */
UATTN_API uattn_status uattn_count_causal_conv1d_programs(const int32_t *query_start_loc, int32_t num_reqs,
                                                          int32_t block_m, int32_t *num_programs,
                                                          int32_t *seed_buffer_len);

/* The seed's compute_causal_conv1d_metadata: one program per block_m query tokens of each request;
 * batch_ptr[i] is program i's request and token_chunk_offset_ptr[i] its block within the request;
 * [num_programs, capacity) is filled with UATTN_PAD_SLOT_ID (capacity = seed_buffer_len gives the seed's
 * buffers). programs_per_req ([num_reqs], optional) receives the seed's "nums". */
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

/* The v0 seed's get_num_prefill_decode_query_kv_tokens. Encoder: num_encoder_tokens for prefill queries
 * and keys, no decode. Encoder-decoder: the decoder's prefill and decode tokens query, the encoder's
 * tokens are the prefill keys. Decoder and encoder-only: num_prefill_tokens for both, plus the decode
 * tokens. num_encoder_tokens -1 means unset (the seed's None), an error for the encoder types. */
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

/* The v0 seed's get_seq_len_block_table_args: decoder -> seq_lens, max prefill or decode seq len (by
 * is_prompt), block_tables; encoder-decoder -> encoder seq lens and max, cross block tables; encoder ->
 * encoder seq lens and max, no block table; encoder-only -> UATTN_ERR_UNSUPPORTED (the seed raises). The
 * fields chosen must be set (pointers non-NULL, lengths >= 0). */
UATTN_API uattn_status uattn_select_seq_len_block_table(const uattn_attention_metadata *metadata, bool is_prompt,
                                                        uattn_attention_type type, uattn_seq_len_block_table *out);
/* END batch utilities */

/* ------------------------------------------------------------------------------------------------ */
/* Tuning files                                                                                     */
/* ------------------------------------------------------------------------------------------------ */

/* BEGIN tuning */
/*
 * A tuning file says, per kernel bucket (block_size, head_dim, cache dtype), which values of the tunables
 * ran a workload fastest on one machine; perf/uattn-sweep measures them and writes it. The thread count
 * changes the speed only, never the results (bitwise). The query tile, the chunk size and split-K regroup
 * the fp32 sums (causal slices, shared chunks, key ranges merged), so they change results within the
 * tolerances the tests state, not bit for bit. A runtime takes one
 *  - at creation, from the file named by the environment variable UATTN_TUNING_FILE (unset or "" = none);
 *  - from uattn_runtime_load_tuning(rt, path) at any time.
 * What is applied: a layer field or plan-config field left at 0 (the library default) takes the tuned
 * value of its bucket; a value the engine set itself always wins. The forward applies query_tile,
 * chunk_size and num_threads to each call; split_min_keys and split_keys belong to the plan, created
 * before any layer, so an engine takes them with uattn_runtime_tuned_plan_config (and may take the layer
 * fields itself with uattn_runtime_tuned_layer). A bucket with no entry runs on the defaults.
 *
 * The file, JSON (format_version UATTN_TUNING_FORMAT_VERSION):
 *   {"format": "uattn-tuning", "format_version": 1, "uattn_version": "0.1.0",
 *    "cpu": {"vendor": "AuthenticAMD", "model": "AMD EPYC 7B13", "kernel_set": "avx2"},
 *    "date": "2025-06-01T12:00:00Z",
 *    "workload": {"trace": "generated", "steps": 16, ...},          <- any JSON: what it was tuned on
 *    "entries": [{"block_size": 16, "head_dim": 128, "cache_dtype": "bf16",
 *                 "chunk_size": 0, "query_tile": 256, "split_min_keys": 2048, "split_keys": 1024,
 *                 "num_threads": 2, "tuned_ms": 41.2, "default_ms": 45.0}]}
 * In an entry the bucket keys are required and the rest optional (0 when absent); cache_dtype is "f32",
 * "bf16" or "f16". "date" and "workload" are optional.
 *
 * A file is refused, with a status and a message naming the file and the reason, and the runtime keeps
 * what it had (the library defaults unless a file was loaded before), when
 *  - it cannot be read, or is over 16 MiB                        UATTN_ERR_INVALID_ARGUMENT / _TOO_LARGE
 *  - it is not JSON, lacks a key, has a key of the wrong type or an unknown key (a typo must not
 *    silently do nothing), or has two entries for one bucket     UATTN_ERR_INVALID_ARGUMENT
 *  - "format" is not "uattn-tuning" or format_version is another UATTN_ERR_UNSUPPORTED
 *  - it is stale: made by another uattn version, on another CPU (vendor or model name differ), or for
 *    another kernel set than uattn_kernel_set() picks now (UATTN_ISA may force one)
 *                                                                UATTN_ERR_INCONSISTENT
 *  - a value is out of range (see uattn_tuning_entry)           UATTN_ERR_OUT_OF_RANGE
 *
 * UATTN_TUNING_FILE and a refused file: uattn_runtime_create still succeeds, on the defaults, and leaves
 * uattn_last_error() empty; uattn_runtime_tuning_info (last_status, message) and the report say why the
 * file was refused. This differs on purpose from UATTN_NUM_THREADS, whose error fails creation: a tuning
 * file changes speed only, and one made stale by a CPU, kernel-set or library upgrade must not stop an
 * engine from starting. An engine that wants to fail instead checks uattn_runtime_tuning_info after
 * creation, or calls uattn_runtime_load_tuning itself and checks its status.
 */
#define UATTN_TUNING_FORMAT_VERSION 1
/* The uattn version as one number (MAJOR * 10000 + MINOR * 100 + PATCH) for compile-time checks; the
 * library actually linked is uattn_version(). A tuning file must name that exact version. */
#define UATTN_VERSION_NUMBER (UATTN_VERSION_MAJOR * 10000 + UATTN_VERSION_MINOR * 100 + UATTN_VERSION_PATCH)

/* Largest values a tuning entry may hold. */
#define UATTN_TUNING_MAX_BLOCK_SIZE 65536
#define UATTN_TUNING_MAX_HEAD_DIM 4096
#define UATTN_TUNING_MAX_TILE (1 << 20) /* chunk_size, query_tile */

/* One kernel bucket and its tuned values. 0 in a tunable means the library's default. */
typedef struct uattn_tuning_entry {
  int32_t block_size;      /* the bucket: tokens per KV block, 1..UATTN_TUNING_MAX_BLOCK_SIZE */
  int32_t head_dim;        /* 1..UATTN_TUNING_MAX_HEAD_DIM */
  uattn_dtype cache_dtype; /* of the KV caches */
  int32_t chunk_size;      /* uattn_layer.chunk_size: shared blocks per online-merge chunk, 0 = whole */
  int32_t query_tile;      /* uattn_layer.causal_width: query rows per tile, 0 = its default */
  int32_t split_min_keys;  /* uattn_plan_config.split_min_keys, >= 0 (0 = 8192) */
  int32_t split_keys;      /* uattn_plan_config.split_keys, >= 0 (0 = 4096) */
  int32_t num_threads;     /* workers a call of this bucket runs on, 0..UATTN_RUNTIME_MAX_THREADS, 0 = all */
  /* What the sweep measured, for the reader (not used by the library): the workload's time in ms with
   * these values and with the defaults; >= 0, 0 = not measured. */
  double tuned_ms;
  double default_ms;
} uattn_tuning_entry;

/* What a tuning file records about the machine it was made on; uattn_tuning_host_get gives this one's. */
typedef struct uattn_tuning_host {
  char cpu_vendor[32];    /* CPUID's vendor ("AuthenticAMD", "GenuineIntel"), else /proc/cpuinfo's */
  char cpu_model[128];    /* CPUID's brand string, else /proc/cpuinfo's "model name"; spaces trimmed */
  char kernel_set[32];    /* uattn_kernel_set(): what uattn_forward runs here now */
  char uattn_version[16]; /* uattn_version() */
} uattn_tuning_host;

UATTN_API uattn_status uattn_tuning_host_get(uattn_tuning_host *out);

/* Writes a tuning file for this machine (uattn_tuning_host_get) with num_entries entries (>= 0, each
 * valid as the loader checks, no bucket twice). workload_json: JSON text describing the workload, stored
 * as parsed (NULL = {}); date: any text, NULL = now in UTC ("YYYY-MM-DDTHH:MM:SSZ"). The file is written
 * next to path and renamed over it, so a reader never sees half a file. */
UATTN_API uattn_status uattn_tuning_write(const char *path, const uattn_tuning_entry *entries, int32_t num_entries,
                                          const char *workload_json, const char *date);

/* Loads a tuning file into rt, replacing the one it had (see above for what is refused: then rt keeps
 * what it had). path NULL drops the tuning: back to the defaults. Safe while other threads run forward
 * calls on rt: each call sees the old tuning or the new one, never a mix. */
UATTN_API uattn_status uattn_runtime_load_tuning(uattn_runtime *rt, const char *path);

/* Where a runtime's tuning stands. */
typedef struct uattn_tuning_info {
  bool loaded;              /* a file's entries are in use */
  bool from_env;            /* the last load was the one from UATTN_TUNING_FILE at creation */
  int32_t num_entries;      /* of the file in use */
  char file[512];           /* the file in use ("" = the defaults), truncated if longer */
  uattn_status last_status; /* of the last load tried (UATTN_OK if none, or if it succeeded) */
  char message[512];        /* why it was refused ("" if it was not) */
} uattn_tuning_info;

UATTN_API uattn_status uattn_runtime_tuning_info(const uattn_runtime *rt, uattn_tuning_info *out);

/* A text report for people: the file in use (its CPU, date and workload) or why the last one was refused,
 * every entry with how many forward calls it served, and the buckets that ran on the defaults for want of
 * an entry. Writes at most cap bytes to buf, NUL included, and the report's length (without the NUL) to
 * *length; buf NULL and cap 0 give the length only. A cap too small is UATTN_ERR_CAPACITY, nothing written. */
UATTN_API uattn_status uattn_runtime_tuning_report(const uattn_runtime *rt, char *buf, size_t cap, size_t *length);

/* The entry rt holds for a bucket: *found (optional) says whether there is one; without one, *out is the
 * bucket with every tunable 0 (the defaults). Does not count as a use. */
UATTN_API uattn_status uattn_runtime_tuning_lookup(const uattn_runtime *rt, int32_t block_size, int32_t head_dim,
                                                   uattn_dtype cache_dtype, uattn_tuning_entry *out, bool *found);

/* Fills the split-K fields of a plan config from the bucket (config->block_size, head_dim, cache_dtype):
 * split_min_keys and split_keys are each replaced when they are 0 or still hold the values of
 * uattn_plan_config_default (8192 and 4096) and the entry's is not 0; any other value, and every other
 * field, is left alone. Call it between uattn_plan_config_default and uattn_plan_create. No entry: the
 * config is unchanged (still UATTN_OK). */
UATTN_API uattn_status uattn_runtime_tuned_plan_config(const uattn_runtime *rt, int32_t head_dim,
                                                       uattn_dtype cache_dtype, uattn_plan_config *config);

/* Fills causal_width and chunk_size of a layer that left them at 0 from the bucket (block_size,
 * layer->head_dim, layer->cache_dtype). The forward does the same by itself; this is for an engine that
 * wants to see or keep the values. No entry: the layer is unchanged (still UATTN_OK). */
UATTN_API uattn_status uattn_runtime_tuned_layer(const uattn_runtime *rt, int32_t block_size, uattn_layer *layer);
/* END tuning */

#ifdef __cplusplus
}
#endif

#endif /* UATTN_H */
