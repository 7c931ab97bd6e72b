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
/* Bucketing: padding a step to static shapes (the Gaudi plugin's, for engines that need them)      */
/* ------------------------------------------------------------------------------------------------ */

/* A batch shape. query_len: query tokens; shared_blocks: distinct shared context blocks; unique_blocks:
 * the Gaudi plugin's unique dimension (largest unique block id + 1); logits: sampled positions. */
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
/* Data-parallel padding added to each padded dimension (the Gaudi plugin's get_dp_padding_fn); >= 0. */
typedef int32_t (*uattn_dp_padding_fn)(void *user, int32_t padded_size);

typedef enum uattn_bucketing_mode {
  UATTN_BUCKETING_NONE = 0,        /* padded shape = exact shape */
  UATTN_BUCKETING_EXPONENTIAL = 1, /* the Gaudi plugin's exponential ranges and filters */
  UATTN_BUCKETING_CUSTOM = 2,      /* call uattn_bucketing.fn */
} uattn_bucketing_mode;

typedef struct uattn_bucketing {
  uattn_bucketing_mode mode;
  uattn_bucket_fn fn; /* CUSTOM only */
  void *fn_user;
  uattn_dp_padding_fn dp_padding; /* optional, any mode */
  void *dp_padding_user;
} uattn_bucketing;

/* A range built the Gaudi plugin's way from (min, max, round_up): 0 is included and min becomes 1 when min is 0;
 * ten points min*(max/min)^(i/9), each rounded up to round_up (the last one is max), deduplicated, sorted.
 * Writes up to cap values to out and their count to *count. */
UATTN_API uattn_status uattn_bucket_range(int32_t min, int32_t max, int32_t round_up, int32_t *out, int32_t cap,
                                          int32_t *count);

/* ------------------------------------------------------------------------------------------------ */
/* The unified-batch planner (the Gaudi plugin's create_unified_batch)                              */
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
  /* Materializing the graph tensors' shared bias above this many bytes is refused (UATTN_ERR_TOO_LARGE).
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
   * becomes (entries != -1) + 1: -1 entries are placeholders and do not count (as in the Gaudi plugin). */
  const int32_t *draft_tokens;
  const int32_t *draft_offsets; /* [num_reqs + 1] or NULL; >= 0 and non-decreasing */
  /* Async scheduling (the Gaudi plugin's rule): when exactly one request samples nothing (a prompt that is still
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

/* The Gaudi plugin's bucket list for this plan's config (UATTN_BUCKETING_EXPONENTIAL), sorted. Writes the list and its
 * length to *count (buckets NULL and cap 0: only the length); causal[i], when given, says whether bucket i
 * is for batches with prompts. The logits of each bucket are max_num_seqs. */
UATTN_API uattn_status uattn_plan_buckets(const uattn_plan *plan, uattn_bucket *buckets, bool *causal, int32_t cap,
                                          int32_t *count);

/* Graph tensors, padded to the plan's padded bucket with the Gaudi plugin's pad values (-1 for ids and
 * block mappings, -inf for biases; 0.0 means visible). Built on request by uattn_plan_materialize. */
typedef enum uattn_graph_tensor {
  UATTN_GRAPH_CAUSAL_BIAS = 1 << 0,  /* float [tq, tq] */
  UATTN_GRAPH_SHARED_BIAS = 1 << 1,  /* float [tq, ts, bs] */
  UATTN_GRAPH_SHARED_USAGE = 1 << 2, /* int32 [tq, ts], PR 784's dense usage table, 0 = masked */
  UATTN_GRAPH_UNIQUE_BIAS = 1 << 3,  /* float [tu, bs] and int32 unique block mapping [tu] */
  UATTN_GRAPH_PADDED_IDS = 1 << 4,   /* int64 slot mapping [tq], int32 token ids/positions [tq], logits [tl] */
} uattn_graph_tensor;

typedef struct uattn_graph_tensors {
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
} uattn_graph_tensors;

/* Builds the requested tensors (an OR of uattn_graph_tensor) for the current step. Semantics follow uattn,
 * not the Gaudi plugin's two defects: decode rows get nothing from the causal bias (their keys are in the cache)
 * and usages are per token. A shared bias above the plan's byte limit is refused. */
UATTN_API uattn_status uattn_plan_materialize(uattn_plan *plan, unsigned what, uattn_graph_tensors *out);

/* ------------------------------------------------------------------------------------------------ */
/* The runtime: threads pinned to cores, created once by an engine                                  */
/* ------------------------------------------------------------------------------------------------ */
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
 * workers and waits until each has bound itself (milliseconds, mostly hwloc's discovery of the machine).
 * config NULL = the defaults (environment included). An engine creates one runtime and keeps
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

/* ------------------------------------------------------------------------------------------------ */
/* KV cache memory                                                                                  */
/* ------------------------------------------------------------------------------------------------ */

/* Zeroed memory for a KV cache, on 2 MiB pages where the system gives them: `bytes` rounded up to whole
 * 2 MiB pages, 2 MiB-aligned, and asked for transparent huge pages (madvise MADV_HUGEPAGE: honoured under
 * the THP settings "always" and "madvise"; under "never" the memory is on 4 KiB pages and works the same).
 * Why: a step's decodes read their blocks wherever they lie in the cache, and on 4 KiB pages every 4 KiB
 * read is a TLB miss and a page walk (docs/performance.md has what it buys). Any cache memory works with
 * uattn_forward; this is only faster.
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
   * multiple of 16 and an even head dim. Its decodes are the fastest of the three layouts where the CPU has
   * AVX512-BF16 (bf16 and fp8 caches, head dims a multiple of 32) and, of bf16 caches, on AVX2 (head dims a
   * multiple of 16; fp8 there about level with NHD), and its prefill-like parts a little slower: a layout for
   * decode-heavy serving. Other caches' blocks are gathered into rows. Figures: docs/performance.md. */
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
  int32_t causal_width;      /* query rows per tile (the Gaudi plugin's causal slice); 0 = 64 x num_kv_heads, at most
                              * the Gaudi plugin's 512 (fewer KV heads: smaller tiles, so a prompt is work for
                              * several workers) */
  int32_t chunk_size;        /* shared blocks per chunk with an online-softmax merge (PR 784); 0 = whole */
  /* Kernels with bf16 dot products (the avx512bf16 level: bf16 layers on bf16 caches) multiply P V with P
   * rounded to bf16 (relative error 2^-9 each, accumulated in fp32), as vLLM's AMX path and PyTorch's CPU
   * flash attention do: the default (false); the output moves by up to 2^-9 of the weighted |v|, beside the bf16
   * output's own rounding. true keeps P in fp32 there
   * (fp32 FMAs with V widened: the other levels' arithmetic for that product). Other levels always keep P
   * in fp32. */
  bool probs_fp32;
  /* fp8 caches only (ignored otherwise): the per-layer scales of the keys and the values, finite and > 0
   * (uattn_layer_default: 1). The cache write stores fp8(k / k_scale) and fp8(v / v_scale); the attention
   * reads fp8 * k_scale and fp8 * v_scale for every key and value, this step's own included: a prompt row
   * sees its own step's keys quantized as a later step will (uattn_forward). */
  float k_scale, v_scale;
  /* Values of another width than the keys (multi-head latent attention's expanded form: DeepSeek-V3's keys 192
   * dims, values 128): v [T, Hkv, head_dim_v], the value cache's rows and out [T, Hq, head_dim_v]. 0: head_dim. */
  int32_t head_dim_v;
  /* Multi-head latent attention's absorbed form: the key cache holds one latent per token and KV head (DeepSeek-V3's
   * 576 dims) whose first head_dim_v dims are also its value (512 of them). There is no value cache: tensors.v and
   * value_cache are NULL, the cache write stores the keys alone, and each latent is read for both products. Needs
   * 0 < head_dim_v <= head_dim, an NHD or HND cache (a latent has no value rows to tile), and on an fp8 cache
   * v_scale == k_scale (the values are the keys' bytes). The model's score scale is not 1/sqrt(head_dim): set
   * scale (DeepSeek-V3: 1/sqrt(192)). */
  bool kv_latent;
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

/* The tensors of one forward call. q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, Dv] and out [T, Hq, Dv] are dense in
 * the layer's dtype (T = the plan's num_tokens; D the layer's head_dim, Dv its head_dim_v or D); the caches are in
 * cache_dtype and kv_layout, the key cache's rows D long and the value cache's Dv (a kv_latent layer has neither v
 * nor a value cache). Every buffer must
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
  /* true: out is fp32 [T, Hq, Dv] whatever the layer's dtype, the fp32 result before its one rounding to the
   * dtype. For partial results that uattn_merge_states will merge (several calls over disjoint keys, the
   * ranks of context parallelism), so that the merge adds no rounding of its own. */
  bool out_f32;
} uattn_tensors;

/* Writes this step's k and v into the caches at the plan's slot mapping, then computes attention for every
 * query row (docs/design.md): the causal, shared and unique parts of the Gaudi plugin's unified attention, merged with its fmin/feps
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
 * ("amx", "avx512bf16fma", "avx512bf16", "avx512", "avx2", "portable"), and in *why (when not NULL) how it was
 * chosen: the best
 * set the CPU runs, or the one the environment variable UATTN_ISA names. UATTN_ISA names the highest level to
 * use, not one to force on every layer: each layer takes the best level at or below it that keeps the layer's
 * precision. amx, avx512bf16fma and avx512bf16 round their inputs to bf16, so they serve bf16 queries on bf16 or
 * fp8 caches (exact in bf16) and an f32 or f16 layer takes the avx512 level below them, UATTN_ISA naming them or
 * not (uattn_describe_kernels says which level a layer gets, and why). avx512bf16fma (avx512's fp32 attend with
 * avx512bf16's decode kernels) is the level of Intel's cores without AMX, where vdpbf16ps runs at half the fp32
 * FMA rate; other CPUs pass it over. A level the CPU lacks (or passes over) gives the best one below it; UATTN_TWINS=1 (the test suites set it) runs that level's exact twin instead, which computes its
 * bits on any AVX2 CPU, slowly. */
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
  /* the kernel bucket the layer asks for: the caches' block size, the head dim the kernels run at (head_dim;
   * where head_dim_v is larger and kv_latent false, head_dim_v), the cache dtype and the chunk size (the
   * layer's, or the tuning file's when the layer leaves it 0) */
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
   * its decode kernel followed by " (gathered)": the blocks are copied into rows first, as they are on every
   * layout where the value rows are another length than the key rows (panels_gathered). */
  char decode_kernel[64];
  /* Whether the panel loads (every part but the decode kernel's) copy the blocks into rows first: on a TILED
   * cache where the set has no load for that layout or the cache is f16 or f32, and on any layout where the
   * value rows are another length than the key rows (head_dim_v without kv_latent), whose rows are copied
   * head_dim_v or head_dim long, whichever is longer, with zeros after each row's end. */
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

/* The Gaudi plugin's partial form: an unnormalized output sum_j e^(s_j - m) v_j, its row max m and its row sum
 * l = sum_j e^(s_j - m). Merges num_parts of them per (row, head) the Gaudi plugin's way, with fmin (a floor for
 * the max) and feps (a floor for the sum) guards: a row whose parts are all empty gets zeros. */
UATTN_API uattn_status uattn_merge_partials(int32_t num_parts, const float *const *outs, const float *const *maxes,
                                            const float *const *sums, int32_t rows, int32_t heads, int32_t head_dim,
                                            float *out);

#ifdef __cplusplus
}
#endif

#endif /* UATTN_H */
