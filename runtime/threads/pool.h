/* The runtime's thread pool and topology, as the rest of the library sees them. Implemented in
 * runtime/threads/runtime.c (public uattn_runtime_*), runtime/threads/pool.c (threads) and runtime/threads/topology.c (hwloc). */
#ifndef UATTN_POOL_H
#define UATTN_POOL_H

#include "common/internal.h"

/* A job: called once on every worker, the calling thread being worker 0, with the same ctx. */
typedef void (*uattn_job_fn)(void *ctx, int32_t worker, int32_t num_workers);

/* Runs fn on each of the runtime's workers and returns when all have returned. Calls from several engine
 * threads on one runtime are serialized. rt NULL runs fn(ctx, 0, 1) on the calling thread. */
void uattn_runtime_run(uattn_runtime *rt, uattn_job_fn fn, void *ctx);

/* fn on the calling thread alone, as worker 0 of 1, for a job with nothing to share: publishing it would
 * wake sleeping workers only to find no work, and the caller waits for the last of them (tens of
 * microseconds a wake-up on a VM). rt NULL as uattn_runtime_run. */
void uattn_runtime_run_alone(uattn_runtime *rt, uattn_job_fn fn, void *ctx);

/* Holds rt for the calling engine thread across several runs, until uattn_runtime_release: no other
 * thread's run starts on rt in between, so what one run leaves in the workers' scratch is still there for
 * the next (a forward's passes share it). Runs of the holding thread go through; a hold inside a hold, or
 * inside a job of rt, changes nothing. Returns whether this call took rt, to hand to the release. */
bool uattn_runtime_hold(uattn_runtime *rt);
void uattn_runtime_release(uattn_runtime *rt, bool taken);

/* Workers of a runtime (1 for NULL). */
int32_t uattn_runtime_workers(const uattn_runtime *rt);

/* Scratch memory of one worker, at least `bytes`, 64-byte aligned, kept and grown between calls (and so
 * reused by the next run: hold rt to keep it across runs). Called by that worker itself (so a fresh page is first touched on its NUMA node). NULL when out of memory. For rt
 * NULL, a thread-local buffer of the calling thread. */
void *uattn_worker_scratch(uattn_runtime *rt, int32_t worker, size_t bytes);

/* Whether a worker's scratch already holds `bytes` (uattn_worker_scratch would not grow it), so a caller
 * holding rt may skip a run that only reserves it. rt NULL: the calling thread's buffer. */
bool uattn_worker_scratch_fits(uattn_runtime *rt, int32_t worker, size_t bytes);

/* The NUMA node of a worker as a compact index in [0, *num_nodes), for handing out work node by node.
 * Workers whose node is unknown (unbound ones, such as the caller) get node 0; a single-node machine or rt
 * NULL gives *num_nodes 1. */
int32_t uattn_worker_node(const uattn_runtime *rt, int32_t worker, int32_t *num_nodes);

#endif
