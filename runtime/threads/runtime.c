/* The public runtime calls: the config and its environment variables, creation (topology, placement of
 * the workers), destruction and the topology report. Threads live in pool.c, hwloc in topology.c. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "threads/runtime_impl.h"
#include "tuning/tuning.h"

#define UATTN_MAX_SPIN_US 1000000

uattn_runtime_config uattn_runtime_config_default(void) {
  uattn_runtime_config c;
  memset(&c, 0, sizeof c);
  c.pin = true;
  c.spin_us = 50;
  return c;
}

/* $UATTN_NUM_THREADS into *out; left alone when unset or empty. Strict: "4 " or "four" is an error. */
static uattn_status env_num_threads(int32_t *out) {
  const char *s = getenv("UATTN_NUM_THREADS");
  if (!s || !*s) return UATTN_OK;
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (*s < '0' || *s > '9' || *end != '\0' || errno || v > UATTN_RUNTIME_MAX_THREADS)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT,
                      "UATTN_NUM_THREADS=\"%s\": expected a whole number of threads in [0, %d] (0 = one per core)", s,
                      UATTN_RUNTIME_MAX_THREADS);
  *out = (int32_t)v;
  return UATTN_OK;
}

static uattn_status check_config(const uattn_runtime_config *c) {
  if (c->num_threads < 0 || c->num_threads > UATTN_RUNTIME_MAX_THREADS)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "num_threads %d: give 0 (one per core) to %d", c->num_threads,
                      UATTN_RUNTIME_MAX_THREADS);
  if (c->spin_us < 0 || c->spin_us > UATTN_MAX_SPIN_US)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "spin_us %d: give 0 (sleep at once) to %d", c->spin_us,
                      UATTN_MAX_SPIN_US);
  return UATTN_OK;
}

static void free_runtime(uattn_runtime *rt) {
  uattn_alloc alloc = rt->alloc;
  pthread_mutex_destroy(&rt->run_lock);
  pthread_mutex_destroy(&rt->start_lock);
  pthread_cond_destroy(&rt->start_cond);
  /* pthread_self() is compared, never another thread's handle used: that thread may have exited */
  if (rt->caller_bound && pthread_equal(rt->caller_thread, pthread_self()))
    uattn_topo_bind_thread(&rt->topo, rt->caller_prev);
  uattn_tuning_runtime_release(rt);
  hwloc_bitmap_free(rt->caller_prev);
  hwloc_bitmap_free(rt->worker_pus);
  hwloc_bitmap_free(rt->caller_binding);
  uattn_topo_release(&rt->topo);
  uattn_alloc_release(&alloc, rt->workers, (size_t)rt->num_workers * sizeof *rt->workers);
  uattn_alloc_release(&alloc, rt, sizeof *rt);
}

/* Worker k goes to usable core k mod cores: worker 0 (the caller) keeps core 0 for itself when there are as
 * many workers as cores, and extra workers wrap around. */
static uattn_status place_workers(uattn_runtime *rt, const uattn_runtime_config *c) {
  uattn_topo *t = &rt->topo;
  uattn_topology *info = &rt->info;
  info->num_workers = rt->num_workers;
  info->pinned = c->pin;
  info->oversubscribed = rt->oversubscribed;
  info->caller_pu = t->core_pu_os[0];
  for (int32_t k = 0; k < rt->num_workers; k++) {
    uattn_worker *w = &rt->workers[k];
    int32_t core = k % t->num_cores;
    bool bound = k == 0 ? c->pin_caller : c->pin;
    w->rt = rt;
    w->index = k;
    uattn_alloc_init(&w->alloc, &rt->alloc.hooks);
    /* Without pin the workers still bind to the usable set: a thread inherits the binding of the thread
     * that created it, which may be an engine thread pinned to one core. */
    w->bind_set = k == 0 ? NULL : (c->pin ? t->core_pu[core] : t->usable);
    w->pu = bound ? t->core_pu_os[core] : -1;
    if (k > 0 && bound) hwloc_bitmap_set(rt->worker_pus, (unsigned)w->pu);
    if (k < UATTN_TOPOLOGY_MAX_WORKERS) {
      info->worker_pu[k] = w->pu;
      info->worker_numa[k] = bound ? t->core_numa[core] : -1;
    }
  }
  for (int32_t k = rt->num_workers; k < UATTN_TOPOLOGY_MAX_WORKERS; k++) info->worker_pu[k] = info->worker_numa[k] = -1;
  if (c->pin_caller) {
    if (!(rt->caller_prev = hwloc_bitmap_alloc()))
      return uattn_fail(UATTN_ERR_NO_MEMORY, "out of memory creating a runtime");
    int err = hwloc_get_cpubind(t->topo, rt->caller_prev, HWLOC_CPUBIND_THREAD) != 0 ? errno : 0;
    if (!err) err = uattn_topo_bind_thread(t, t->core_pu[0]);
    if (err)
      return uattn_fail(UATTN_ERR_UNSUPPORTED, "pin_caller: could not bind the calling thread to PU %d: %s",
                        t->core_pu_os[0], strerror(err));
    rt->caller_bound = true;
    rt->caller_thread = pthread_self();
  }
  return UATTN_OK;
}

uattn_status uattn_runtime_create(const uattn_runtime_config *config, uattn_runtime **out) {
  uattn_clear_error();
  UATTN_CHECK_PTR(out, "out");
  uattn_runtime_config c = config ? *config : uattn_runtime_config_default();
  uattn_status st = check_config(&c);
  if (st != UATTN_OK) return st;

  /* the environment fills what the config leaves open */
  const char *cpuset_from = "config.cpuset";
  if (c.num_threads == 0 && (st = env_num_threads(&c.num_threads)) != UATTN_OK) return st;
  if (c.cpuset && !*c.cpuset) c.cpuset = NULL;
  if (!c.cpuset) {
    const char *env = getenv("UATTN_CPUSET");
    if (env && *env) {
      c.cpuset = env;
      cpuset_from = "UATTN_CPUSET";
    }
  }

  uattn_alloc alloc;
  if ((st = uattn_alloc_init(&alloc, c.allocator)) != UATTN_OK) return st;
  uattn_runtime *rt = uattn_alloc_bytes(&alloc, sizeof *rt);
  if (!rt) return uattn_fail(UATTN_ERR_NO_MEMORY, "out of memory creating a runtime");
  memset(rt, 0, sizeof *rt);
  rt->alloc = alloc;
  pthread_mutex_init(&rt->run_lock, NULL);
  pthread_mutex_init(&rt->start_lock, NULL);
  pthread_cond_init(&rt->start_cond, NULL);

  if ((st = uattn_topo_load(&rt->topo, c.cpuset, cpuset_from)) != UATTN_OK) {
    free_runtime(rt);
    return st;
  }
  if (!(rt->worker_pus = hwloc_bitmap_alloc()) || !(rt->caller_binding = hwloc_bitmap_alloc())) {
    free_runtime(rt);
    return uattn_fail(UATTN_ERR_NO_MEMORY, "out of memory creating a runtime");
  }
  uattn_topo_describe(&rt->topo, &rt->info);
  int32_t n = c.num_threads ? c.num_threads : rt->topo.num_cores;
  rt->workers = uattn_alloc_bytes(&rt->alloc, (size_t)n * sizeof *rt->workers);
  if (!rt->workers) {
    free_runtime(rt);
    return uattn_fail(UATTN_ERR_NO_MEMORY, "out of memory creating %d workers", n);
  }
  memset(rt->workers, 0, (size_t)n * sizeof *rt->workers);
  rt->num_workers = n;
  rt->spin_ns = (int64_t)c.spin_us * 1000;
  rt->oversubscribed = n > rt->topo.num_cores;

  /* the tuning file ($UATTN_TUNING_FILE): a refused one leaves the defaults and does not fail creation */
  if ((st = uattn_tuning_runtime_init(rt)) != UATTN_OK || (st = place_workers(rt, &c)) != UATTN_OK ||
      (st = uattn_pool_start(rt)) != UATTN_OK) {
    free_runtime(rt);
    return st;
  }
  *out = rt;
  return UATTN_OK;
}

void uattn_runtime_destroy(uattn_runtime *rt) {
  if (!rt) return;
  uattn_pool_stop(rt);
  free_runtime(rt);
}

uattn_status uattn_runtime_get_topology(const uattn_runtime *rt, uattn_topology *out) {
  uattn_clear_error();
  UATTN_CHECK_PTR(rt, "rt");
  UATTN_CHECK_PTR(out, "out");
  *out = rt->info;
  return UATTN_OK;
}
