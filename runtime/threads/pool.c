/* The runtime's workers: dispatch of a job to every worker, waiting, and per-worker scratch.
 *
 * A job is published by writing (fn, ctx) and then incrementing `generation` (release). Idle workers spin
 * on generation for spin_us, then sleep on it with a futex; the dispatcher only makes the wake-up system
 * call when some worker announced that it sleeps (`sleepers`), so back-to-back jobs cost a few cache-line
 * transfers. The caller runs worker 0's share itself, then waits for the `done` count (see wait_done: it
 * spins, or sleeps on it with a futex when spin_us is 0). Each sleep is announced with a seq_cst increment followed by a seq_cst re-read of the word,
 * and each publication is a seq_cst write followed by a seq_cst read of the sleeper count: one of the two
 * always sees the other, so no wake-up is lost.
 *
 * Errors: jobs return void. A job that can fail records its status in its ctx (one slot per worker) and the
 * caller reads them after uattn_runtime_run returns; uattn_fail's message is per thread, so a worker's
 * message has to be copied there too. */
#define _GNU_SOURCE /* syscall(), sched_getcpu() */
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#include "threads/runtime_impl.h"

/* ---- sleeping on a 32-bit word ---------------------------------------------------------------------- */

#if defined(__linux__)
static void word_wait(_Atomic uint32_t *word, uint32_t old) {
  /* The kernel sleeps only while *word == old, checked atomically with the queueing: a change made just
   * before is never missed. EINTR, EAGAIN and spurious returns are handled by the callers' loops. */
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, old, NULL, NULL, 0);
}
static void word_wake(_Atomic uint32_t *word, int count) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
}
#else
/* Elsewhere: one process-wide condition variable. Waiters re-check the word under the lock, and wakers take
 * the lock after changing it, so a wake-up cannot fall between the check and the wait. */
static pthread_mutex_t word_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t word_cond = PTHREAD_COND_INITIALIZER;
static void word_wait(_Atomic uint32_t *word, uint32_t old) {
  pthread_mutex_lock(&word_lock);
  while (atomic_load(word) == old) pthread_cond_wait(&word_cond, &word_lock);
  pthread_mutex_unlock(&word_lock);
}
static void word_wake(_Atomic uint32_t *word, int count) {
  (void)word;
  (void)count;
  pthread_mutex_lock(&word_lock);
  pthread_cond_broadcast(&word_cond);
  pthread_mutex_unlock(&word_lock);
}
#endif

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Returns the first value of *word that differs from old (acquire). Spins for spin_ns first, with pause, or
 * with sched_yield where the CPU is shared (a yield hands it to whichever thread waits for it), then sleeps,
 * counting itself in *sleepers while it may be asleep. */
static uint32_t wait_change(_Atomic uint32_t *word, uint32_t old, _Atomic uint32_t *sleepers, int64_t spin_ns,
                            bool yield) {
  uint32_t v = atomic_load_explicit(word, memory_order_acquire);
  if (v != old) return v;
  if (spin_ns > 0) {
    int64_t start = now_ns();
    for (uint32_t i = 1;; i++) {
      if (yield)
        sched_yield();
      else
        cpu_relax();
      v = atomic_load_explicit(word, memory_order_acquire);
      if (v != old) return v;
      /* reading the clock costs about as much as 20 pauses: now and then */
      if ((yield || (i & 31) == 0) && now_ns() - start >= spin_ns) break;
    }
  }
  for (;;) {
    atomic_fetch_add(sleepers, 1);
    if (atomic_load(word) == old) word_wait(word, old);
    atomic_fetch_sub(sleepers, 1);
    v = atomic_load_explicit(word, memory_order_acquire);
    if (v != old) return v;
  }
}

/* ---- workers ------------------------------------------------------------------------------------------- */

/* The runtime whose job this thread is running (NULL outside jobs): a job that calls uattn_runtime_run on
 * the same runtime runs the inner job inline instead of deadlocking on run_lock. */
static _Thread_local uattn_runtime *tls_running;

static void *worker_main(void *arg) {
  uattn_worker *w = arg;
  uattn_runtime *rt = w->rt;
  int err = w->bind_set ? uattn_topo_bind_thread(&rt->topo, w->bind_set) : 0;

  pthread_mutex_lock(&rt->start_lock);
  /* only a pinned worker must be where it was asked to be; binding to the usable set is best effort */
  if (err && rt->info.pinned && rt->bind_errno == 0) {
    rt->bind_errno = err;
    rt->bind_failed_worker = w->index;
  }
  rt->started++;
  pthread_cond_broadcast(&rt->start_cond);
  pthread_mutex_unlock(&rt->start_lock);

  uint32_t seen = 0; /* no job is published before every worker has started */
  const uint32_t last = (uint32_t)rt->num_workers - 1;
  bool share_cpu = rt->oversubscribed; /* with the caller or another worker: spin politely */
  for (;;) {
    seen = wait_change(&rt->generation, seen, &rt->sleepers, rt->spin_ns, share_cpu);
    if (rt->stop) break;
    tls_running = rt;
    rt->job(rt->job_ctx, w->index, rt->num_workers);
    tls_running = NULL;
    share_cpu = rt->oversubscribed || (w->pu >= 0 && rt->caller_cpu == w->pu); /* read before done: see below */
    /* The last worker to finish wakes the caller if it went to sleep. After this increment the caller may
     * return and start the next job, but it cannot destroy rt before joining this thread. */
    if (atomic_fetch_add(&rt->done, 1) + 1 == last && atomic_load(&rt->caller_sleeping)) word_wake(&rt->done, 1);
  }
  return NULL;
}

uattn_status uattn_pool_start(uattn_runtime *rt) {
  /* every worker starts spinning at once: nothing to wait for before the first job */
  for (int32_t i = 1; i < rt->num_workers; i++) {
    uattn_worker *w = &rt->workers[i];
    int err = pthread_create(&w->thread, NULL, worker_main, w);
    if (err) {
      uattn_pool_stop(rt);
      return uattn_fail(UATTN_ERR_NO_MEMORY, "could not start worker thread %d of %d: %s", i, rt->num_workers,
                        strerror(err));
    }
    w->started = true;
  }
  pthread_mutex_lock(&rt->start_lock);
  while (rt->started < rt->num_workers - 1) pthread_cond_wait(&rt->start_cond, &rt->start_lock);
  int err = rt->bind_errno, worker = rt->bind_failed_worker;
  pthread_mutex_unlock(&rt->start_lock);
  if (err) {
    uattn_pool_stop(rt);
    return uattn_fail(UATTN_ERR_UNSUPPORTED,
                      "worker %d could not bind itself to PU %d: %s (set pin = false to run unpinned)", worker,
                      worker < UATTN_TOPOLOGY_MAX_WORKERS ? rt->info.worker_pu[worker] : -1, strerror(err));
  }
  return UATTN_OK;
}

void uattn_pool_stop(uattn_runtime *rt) {
  rt->stop = true;
  atomic_fetch_add_explicit(&rt->generation, 1, memory_order_release);
  word_wake(&rt->generation, INT_MAX);
  for (int32_t i = 1; i < rt->num_workers; i++) {
    uattn_worker *w = &rt->workers[i];
    if (w->started) pthread_join(w->thread, NULL);
    w->started = false;
  }
  for (int32_t i = 0; i < rt->num_workers; i++) uattn_buf_release(&rt->workers[i].alloc, &rt->workers[i].scratch);
}

/* ---- the contract of pool.h ------------------------------------------------------------------------- */

/* The caller waits inside its own call, on its own core: it spins until the job is done rather than pay a
 * futex wake-up per call (35 to 100 us on the 2-vCPU VM, measured), with pause for spin_us and then with
 * yields, so that a thread sharing its CPU still runs. spin_us == 0 asks for no spinning: it sleeps. */
static void wait_done(uattn_runtime *rt, bool share_cpu) {
  const uint32_t last = (uint32_t)rt->num_workers - 1;
  uint32_t d = atomic_load_explicit(&rt->done, memory_order_acquire);
  if (rt->spin_ns == 0) {
    /* only the last worker wakes a sleeping caller: the others' increments just end a wait early */
    while (d != last) d = wait_change(&rt->done, d, &rt->caller_sleeping, 0, false);
    return;
  }
  int64_t pause_until = share_cpu ? 0 : now_ns() + rt->spin_ns;
  for (uint32_t i = 1; d != last; i++) {
    if (pause_until && ((i & 31) || now_ns() < pause_until)) {
      cpu_relax();
    } else {
      pause_until = 0;
      sched_yield();
    }
    d = atomic_load_explicit(&rt->done, memory_order_acquire);
  }
}

/* Its address names the calling thread (rt->holder): unique among live threads, and never 0. */
static _Thread_local char thread_id;

static bool held_here(const uattn_runtime *rt) {
  /* relaxed: a thread only ever finds its own id here, which it stored itself */
  return atomic_load_explicit(&rt->holder, memory_order_relaxed) == (uintptr_t)&thread_id;
}

bool uattn_runtime_hold(uattn_runtime *rt) {
  if (rt == NULL || tls_running == rt || held_here(rt)) return false;
  pthread_mutex_lock(&rt->run_lock);
  atomic_store_explicit(&rt->holder, (uintptr_t)&thread_id, memory_order_relaxed);
  return true;
}

void uattn_runtime_release(uattn_runtime *rt, bool taken) {
  if (!taken) return;
  atomic_store_explicit(&rt->holder, 0, memory_order_relaxed);
  pthread_mutex_unlock(&rt->run_lock);
}

/* fn on the calling thread alone, as worker 0 of 1, marked as a job of rt (a run inside it stays here). */
static void run_inline(uattn_runtime *rt, uattn_job_fn fn, void *ctx) {
  uattn_runtime *outer = tls_running;
  if (rt) tls_running = rt;
  fn(ctx, 0, 1);
  tls_running = outer;
}

/* A caller that runs on a pinned worker's PU would share that PU with the worker for the whole job, and
 * Linux does not move it off in time: every call of a process whose thread had started on the worker's CPU
 * then ran as slowly as on one thread. So the
 * caller moves to caller_pu, the core no worker takes, where its binding allows: bound to that PU alone,
 * which migrates a running thread before the call returns, then given back its binding at once. The engine's
 * thread ends on caller_pu and bound as it was; one whose binding excludes caller_pu stays where it is.
 * Returns the CPU the caller runs on. */
static int move_caller_off_worker(uattn_runtime *rt, int cpu) {
  const uattn_topo *t = &rt->topo;
  if (hwloc_get_cpubind(t->topo, rt->caller_binding, HWLOC_CPUBIND_THREAD) != 0 ||
      !hwloc_bitmap_isset(rt->caller_binding, (unsigned)rt->info.caller_pu))
    return cpu;
  if (uattn_topo_bind_thread(t, t->core_pu[0]) != 0) return cpu;
  /* cannot fail where the same call just read this binding; were it to, the thread stays on caller_pu */
  uattn_topo_bind_thread(t, rt->caller_binding);
  return sched_getcpu();
}

void uattn_runtime_run_alone(uattn_runtime *rt, uattn_job_fn fn, void *ctx) {
  if (rt == NULL || tls_running == rt) { /* a thread of its own, or a job of rt asking rt again */
    run_inline(rt, fn, ctx);
    return;
  }
  /* worker 0's scratch is the runtime's, shared by every engine thread that calls it: held like any run */
  const bool taken = uattn_runtime_hold(rt);
  run_inline(rt, fn, ctx);
  uattn_runtime_release(rt, taken);
}

void uattn_runtime_run(uattn_runtime *rt, uattn_job_fn fn, void *ctx) {
  if (rt == NULL || tls_running == rt || rt->num_workers == 1) {
    uattn_runtime_run_alone(rt, fn, ctx);
    return;
  }
  const bool taken = uattn_runtime_hold(rt);
  rt->job = fn;
  rt->job_ctx = ctx;
  /* The caller is not pinned: the scheduler may have put it on a worker's CPU. It moves off where it may;
   * where it may not, spinning with pause would only delay the very thread it waits for (tens of
   * microseconds per call, measured), so both sides spin with yields instead. sched_getcpu costs tens of
   * nanoseconds (vDSO). */
  int cpu = sched_getcpu();
  if (cpu >= 0 && !rt->oversubscribed && hwloc_bitmap_isset(rt->worker_pus, (unsigned)cpu))
    cpu = move_caller_off_worker(rt, cpu);
  rt->caller_cpu = cpu;
  bool share_cpu = rt->oversubscribed || (cpu >= 0 && hwloc_bitmap_isset(rt->worker_pus, (unsigned)cpu));
  atomic_store_explicit(&rt->done, 0, memory_order_relaxed); /* published by the increment below */
  atomic_fetch_add(&rt->generation, 1);
  if (atomic_load(&rt->sleepers) > 0) word_wake(&rt->generation, INT_MAX);

  uattn_runtime *outer = tls_running;
  tls_running = rt;
  fn(ctx, 0, rt->num_workers);
  tls_running = outer;

  wait_done(rt, share_cpu);
  uattn_runtime_release(rt, taken);
}

int32_t uattn_runtime_workers(const uattn_runtime *rt) { return rt ? rt->num_workers : 1; }

int32_t uattn_worker_node(const uattn_runtime *rt, int32_t worker, int32_t *num_nodes) {
  *num_nodes = 1;
  if (!rt) return 0;
  const int32_t listed = rt->num_workers < UATTN_TOPOLOGY_MAX_WORKERS ? rt->num_workers : UATTN_TOPOLOGY_MAX_WORKERS;
  const int32_t *numa = rt->info.worker_numa;
  /* compact indices in order of first appearance among the workers */
  int32_t nodes = 0, mine = 0;
  for (int32_t w = 0; w < listed; w++) {
    if (numa[w] < 0) continue;
    bool seen = false;
    for (int32_t v = 0; v < w && !seen; v++) seen = numa[v] == numa[w];
    if (seen) continue;
    if (worker < listed && numa[worker] == numa[w]) mine = nodes;
    nodes++;
  }
  if (nodes > 1) *num_nodes = nodes;
  return nodes > 1 ? mine : 0;
}

/* ---- scratch ---------------------------------------------------------------------------------------------- */

/* Without a runtime: one buffer per thread, freed by a thread-exit destructor. The main thread's buffer is
 * not freed at exit() (POSIX runs no key destructors there); it stays reachable and the OS takes it back. */
typedef struct tls_scratch {
  uattn_alloc alloc;
  uattn_buf buf;
} tls_scratch;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static bool scratch_key_ok;

static void tls_scratch_free(void *p) {
  tls_scratch *s = p;
  uattn_buf_release(&s->alloc, &s->buf);
  free(s);
}

static void scratch_key_init(void) { scratch_key_ok = pthread_key_create(&scratch_key, tls_scratch_free) == 0; }

static uattn_buf *thread_scratch(uattn_alloc **alloc) {
  pthread_once(&scratch_once, scratch_key_init);
  if (!scratch_key_ok) return NULL;
  tls_scratch *s = pthread_getspecific(scratch_key);
  if (!s) {
    s = calloc(1, sizeof *s);
    if (!s) return NULL;
    uattn_alloc_init(&s->alloc, NULL);
    if (pthread_setspecific(scratch_key, s) != 0) {
      free(s);
      return NULL;
    }
  }
  *alloc = &s->alloc;
  return &s->buf;
}

/* A worker's scratch buffer and its allocator (rt NULL: the calling thread's); NULL out of range or memory. */
static uattn_buf *worker_buf(uattn_runtime *rt, int32_t worker, uattn_alloc **alloc) {
  if (rt == NULL) return thread_scratch(alloc);
  if (worker < 0 || worker >= rt->num_workers) return NULL;
  *alloc = &rt->workers[worker].alloc;
  return &rt->workers[worker].scratch;
}

bool uattn_worker_scratch_fits(uattn_runtime *rt, int32_t worker, size_t bytes) {
  uattn_alloc *alloc;
  const uattn_buf *buf = worker_buf(rt, worker, &alloc);
  return buf && buf->data && buf->bytes >= bytes;
}

void *uattn_worker_scratch(uattn_runtime *rt, int32_t worker, size_t bytes) {
  uattn_alloc *alloc;
  uattn_buf *buf = worker_buf(rt, worker, &alloc);
  if (!buf) return NULL;
  if (bytes > buf->bytes || buf->data == NULL) {
    if (bytes == 0) bytes = 64; /* a real pointer even for 0 bytes: NULL means out of memory */
    /* uattn_buf_reserve sets this thread's message on failure; the contract only promises NULL */
    if (uattn_buf_reserve(alloc, buf, bytes) != UATTN_OK) return NULL;
  }
  return buf->data;
}
