/* The runtime's insides, shared by runtime/threads/runtime.c (public calls), runtime/threads/pool.c (threads, dispatch,
 * scratch) and runtime/threads/topology.c (hwloc). The rest of the library sees only runtime/threads/pool.h. */
#ifndef UATTN_RUNTIME_IMPL_H
#define UATTN_RUNTIME_IMPL_H

#include <hwloc.h>
#include <pthread.h>
#include <stdatomic.h>

#include "threads/pool.h"

/* ---- topology.c ------------------------------------------------------------------------------------- */

/* The machine, the process's binding and the PUs the runtime may use. */
typedef struct uattn_topo {
  hwloc_topology_t topo;
  hwloc_bitmap_t binding;  /* the process's binding at creation */
  hwloc_bitmap_t usable;   /* binding ∩ the runtime's cpuset */
  int32_t num_cores;       /* usable cores: those with at least one usable PU */
  hwloc_bitmap_t *core_pu; /* [num_cores] the first usable PU of each usable core, one bit each */
  int32_t *core_pu_os;     /* [num_cores] its OS index */
  int32_t *core_numa;      /* [num_cores] its NUMA node's OS index, -1 if unknown */
} uattn_topo;

/* Loads the topology and restricts it to the process's binding and to cpuset (NULL = the whole binding).
 * cpuset_from names where the string came from ("config.cpuset", "UATTN_CPUSET") for the messages. On an
 * error everything is released and the message is set. */
uattn_status uattn_topo_load(uattn_topo *t, const char *cpuset, const char *cpuset_from);
void uattn_topo_release(uattn_topo *t);
/* Counts and caches of t into out (workers left alone). */
void uattn_topo_describe(const uattn_topo *t, uattn_topology *out);
/* Binds the calling thread to set; 0 or an errno value. */
int uattn_topo_bind_thread(const uattn_topo *t, hwloc_const_bitmap_t set);

/* ---- pool.c ------------------------------------------------------------------------------------------ */

/* One worker. Aligned to a cache line so that workers never write to the same line. */
typedef struct uattn_worker {
  _Alignas(64) uattn_runtime *rt;
  int32_t index;
  hwloc_const_bitmap_t bind_set; /* where the thread binds itself; NULL = leave it as created */
  int32_t pu;                    /* the one PU it is pinned to, -1 if none */
  pthread_t thread;
  bool started;      /* thread created (joined at destroy) */
  uattn_alloc alloc; /* the runtime's hooks with this worker's own counters: no sharing between threads */
  uattn_buf scratch;
} uattn_worker;

struct uattn_runtime {
  /* Written by the dispatching caller, read by spinning workers: one line of its own. The job is published
   * by a release increment of generation; workers read job/ctx/stop after an acquire load of it. */
  _Alignas(64) _Atomic uint32_t generation;
  _Atomic uint32_t sleepers; /* workers asleep (or about to be) on generation */
  uattn_job_fn job;
  void *job_ctx;
  int32_t caller_cpu; /* where the caller was when it published the job, -1 if unknown */
  bool stop;

  /* Written by finishing workers, read by the waiting caller. */
  _Alignas(64) _Atomic uint32_t done; /* workers 1.. that finished the current job */
  _Atomic uint32_t caller_sleeping;   /* the caller sleeps (or is about to) on done */

  _Alignas(64) int32_t num_workers;
  int64_t spin_ns;
  bool oversubscribed;           /* a core has several workers: they spin with yields */
  hwloc_bitmap_t worker_pus;     /* PUs of the pinned workers 1.., to tell whether the caller shares one */
  hwloc_bitmap_t caller_binding; /* scratch of move_caller_off_worker (pool.c), under run_lock */
  pthread_mutex_t run_lock;      /* held by one engine thread's run, or by its hold over several (pool.h) */
  _Atomic uintptr_t holder;      /* the thread holding run_lock (pool.c's thread_id), 0 when none */

  /* creation: workers report that they are bound (or why not) */
  pthread_mutex_t start_lock;
  pthread_cond_t start_cond;
  int32_t started;
  int32_t bind_errno; /* first failure */
  int32_t bind_failed_worker;

  /* pin_caller: the thread bound at creation and its binding before, restored by destroy on that thread */
  bool caller_bound;
  pthread_t caller_thread;
  hwloc_bitmap_t caller_prev;

  uattn_alloc alloc;
  uattn_worker *workers; /* [num_workers]; workers[0] is the caller's slot (scratch only) */
  uattn_topo topo;
  uattn_topology info;
  struct uattn_tuning_state *tuning; /* runtime/tuning/tuning.c: the tuning file in use and its use counts */
};

/* Starts workers 1.. of rt (fields above set, topo loaded) and waits until each is bound. On an error the
 * started ones are stopped and joined and the message is set. */
uattn_status uattn_pool_start(uattn_runtime *rt);
/* Stops and joins the workers and frees their scratch. */
void uattn_pool_stop(uattn_runtime *rt);

#endif
