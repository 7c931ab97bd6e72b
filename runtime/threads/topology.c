/* The runtime's view of the machine, through hwloc: the process's binding, the cpuset string, one PU per
 * usable core, cache sizes.
 *
 * hwloc shows the whole machine whatever the process's affinity (under `taskset -c 1` it still lists and
 * lets a thread bind to both cores; only cgroup restrictions are applied for us), so every choice here is
 * made within the process's binding, read once at creation. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "threads/runtime_impl.h"

/* PU indices above this are refused as malformed rather than becoming a huge bitmap. */
#define UATTN_MAX_PU_INDEX (1 << 20)

static int32_t count_in(hwloc_topology_t topo, hwloc_obj_type_t type, hwloc_const_bitmap_t set) {
  int32_t n = 0;
  int total = hwloc_get_nbobjs_by_type(topo, type);
  for (int i = 0; i < total; i++) {
    hwloc_obj_t o = hwloc_get_obj_by_type(topo, type, (unsigned)i);
    if (set == NULL || (o->cpuset && hwloc_bitmap_intersects(o->cpuset, set))) n++;
  }
  return n;
}

/* set NULL: the whole machine (memory-only NUMA nodes included). */
static void count_set(hwloc_topology_t topo, hwloc_const_bitmap_t set, uattn_topology_counts *c) {
  c->packages = count_in(topo, HWLOC_OBJ_PACKAGE, set);
  c->numa_nodes = count_in(topo, HWLOC_OBJ_NUMANODE, set);
  c->pus = count_in(topo, HWLOC_OBJ_PU, set);
  /* Some platforms expose no Core objects: each PU is then its own core. */
  c->cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE) > 0 ? count_in(topo, HWLOC_OBJ_CORE, set) : c->pus;
}

static int32_t numa_of(hwloc_obj_t pu) {
  if (!pu || !pu->nodeset || hwloc_bitmap_iszero(pu->nodeset)) return -1;
  return hwloc_bitmap_first(pu->nodeset);
}

/* Parses "0-3,8" into set. Strict on purpose: a typo must fail, not pin to something unexpected. */
static uattn_status parse_cpuset(const char *s, const char *from, hwloc_bitmap_t set) {
  const char *p = s;
  hwloc_bitmap_zero(set);
  for (;;) {
    long lo, hi;
    if (!isdigit((unsigned char)*p))
      return uattn_fail(UATTN_ERR_INVALID_ARGUMENT,
                        "%s \"%s\": expected a PU index at offset %d (syntax: \"0-3,8\", like taskset -c)", from, s,
                        (int)(p - s));
    char *end;
    lo = strtol(p, &end, 10);
    p = end;
    hi = lo;
    if (*p == '-') {
      p++;
      if (!isdigit((unsigned char)*p))
        return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "%s \"%s\": expected the end of a range at offset %d", from, s,
                          (int)(p - s));
      hi = strtol(p, &end, 10);
      p = end;
    }
    if (lo > UATTN_MAX_PU_INDEX || hi > UATTN_MAX_PU_INDEX)
      return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "%s \"%s\": PU index above %d", from, s, UATTN_MAX_PU_INDEX);
    if (hi < lo)
      return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "%s \"%s\": range %ld-%ld runs backwards", from, s, lo, hi);
    hwloc_bitmap_set_range(set, (unsigned)lo, (int)hi);
    if (*p == '\0') return UATTN_OK;
    if (*p != ',')
      return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "%s \"%s\": unexpected '%c' at offset %d", from, s, *p,
                        (int)(p - s));
    p++;
  }
}

static void free_topo_arrays(uattn_topo *t) {
  if (t->core_pu)
    for (int32_t i = 0; i < t->num_cores; i++) hwloc_bitmap_free(t->core_pu[i]);
  free(t->core_pu);
  free(t->core_pu_os);
  free(t->core_numa);
  t->core_pu = NULL;
  t->core_pu_os = t->core_numa = NULL;
}

void uattn_topo_release(uattn_topo *t) {
  free_topo_arrays(t);
  hwloc_bitmap_free(t->binding);
  hwloc_bitmap_free(t->usable);
  if (t->topo) hwloc_topology_destroy(t->topo);
  memset(t, 0, sizeof *t);
}

/* One entry per usable core, in hwloc's logical order, each with the core's first usable PU: workers go one
 * per core, never two on SMT siblings while a core is free. */
static uattn_status find_cores(uattn_topo *t) {
  int npu = hwloc_get_nbobjs_by_type(t->topo, HWLOC_OBJ_PU);
  t->core_pu = calloc((size_t)npu, sizeof *t->core_pu);
  t->core_pu_os = calloc((size_t)npu, sizeof *t->core_pu_os);
  t->core_numa = calloc((size_t)npu, sizeof *t->core_numa);
  hwloc_bitmap_t covered = hwloc_bitmap_alloc();
  if (!t->core_pu || !t->core_pu_os || !t->core_numa || !covered) {
    hwloc_bitmap_free(covered);
    return uattn_fail(UATTN_ERR_NO_MEMORY, "out of memory reading the topology");
  }
  for (int i = 0; i < npu; i++) {
    hwloc_obj_t pu = hwloc_get_obj_by_type(t->topo, HWLOC_OBJ_PU, (unsigned)i);
    if (!hwloc_bitmap_isset(t->usable, pu->os_index) || hwloc_bitmap_isset(covered, pu->os_index)) continue;
    hwloc_obj_t core = hwloc_get_ancestor_obj_by_type(t->topo, HWLOC_OBJ_CORE, pu);
    hwloc_bitmap_or(covered, covered, core ? core->cpuset : pu->cpuset);
    hwloc_bitmap_t one = hwloc_bitmap_alloc();
    if (!one) {
      hwloc_bitmap_free(covered);
      return uattn_fail(UATTN_ERR_NO_MEMORY, "out of memory reading the topology");
    }
    hwloc_bitmap_only(one, pu->os_index);
    t->core_pu[t->num_cores] = one;
    t->core_pu_os[t->num_cores] = (int32_t)pu->os_index;
    t->core_numa[t->num_cores] = numa_of(pu);
    t->num_cores++;
  }
  hwloc_bitmap_free(covered);
  return UATTN_OK;
}

static uattn_status load(uattn_topo *t, const char *cpuset, const char *cpuset_from) {
  t->binding = hwloc_bitmap_alloc();
  t->usable = hwloc_bitmap_alloc();
  if (!t->binding || !t->usable) return uattn_fail(UATTN_ERR_NO_MEMORY, "out of memory reading the topology");
  if (hwloc_topology_init(&t->topo) != 0) {
    t->topo = NULL;
    return uattn_fail(UATTN_ERR_NO_MEMORY, "hwloc_topology_init failed");
  }
  if (hwloc_topology_load(t->topo) != 0)
    return uattn_fail(UATTN_ERR_UNSUPPORTED, "hwloc could not read the machine's topology (%s)", strerror(errno));

  hwloc_const_bitmap_t machine = hwloc_topology_get_topology_cpuset(t->topo);
  /* PROCESS: the union of every thread's binding, so that one engine thread that pinned itself (or was
   * pinned by pin_caller) does not shrink what a runtime may use while the process has other threads. */
  if (hwloc_get_cpubind(t->topo, t->binding, HWLOC_CPUBIND_PROCESS) != 0 || hwloc_bitmap_iszero(t->binding))
    hwloc_bitmap_copy(t->binding, hwloc_topology_get_allowed_cpuset(t->topo));
  hwloc_bitmap_and(t->binding, t->binding, machine);
  if (hwloc_bitmap_iszero(t->binding))
    return uattn_fail(UATTN_ERR_UNSUPPORTED, "the process's CPU binding holds none of the machine's PUs");

  if (cpuset) {
    uattn_status st = parse_cpuset(cpuset, cpuset_from, t->usable);
    if (st != UATTN_OK) return st;
    if (!hwloc_bitmap_isincluded(t->usable, t->binding)) {
      char want[256], have[256];
      hwloc_bitmap_t outside = hwloc_bitmap_alloc();
      if (!outside) return uattn_fail(UATTN_ERR_NO_MEMORY, "out of memory reading the topology");
      hwloc_bitmap_andnot(outside, t->usable, t->binding);
      hwloc_bitmap_list_snprintf(want, sizeof want, outside);
      hwloc_bitmap_list_snprintf(have, sizeof have, t->binding);
      hwloc_bitmap_free(outside);
      return uattn_fail(UATTN_ERR_OUT_OF_RANGE,
                        "%s \"%s\": PUs %s are outside the process's CPU binding %s (taskset, "
                        "sched_setaffinity or cgroups); give PUs within it",
                        cpuset_from, cpuset, want, have);
    }
  } else {
    hwloc_bitmap_copy(t->usable, t->binding);
  }
  return find_cores(t);
}

uattn_status uattn_topo_load(uattn_topo *t, const char *cpuset, const char *cpuset_from) {
  memset(t, 0, sizeof *t);
  uattn_status st = load(t, cpuset, cpuset_from);
  if (st != UATTN_OK) uattn_topo_release(t);
  return st;
}

void uattn_topo_describe(const uattn_topo *t, uattn_topology *out) {
  count_set(t->topo, NULL, &out->machine);
  count_set(t->topo, t->binding, &out->binding);
  count_set(t->topo, t->usable, &out->usable);
  out->l1d_bytes = out->l2_bytes = out->l3_bytes = 0;
  out->l3_cores = 0;
  if (t->num_cores == 0) return;
  hwloc_obj_t pu = hwloc_get_pu_obj_by_os_index(t->topo, (unsigned)t->core_pu_os[0]);
  for (hwloc_obj_t o = pu ? pu->parent : NULL; o; o = o->parent) {
    if (!hwloc_obj_type_is_dcache(o->type)) continue;
    size_t size = (size_t)o->attr->cache.size;
    if (o->attr->cache.depth == 1 && out->l1d_bytes == 0) out->l1d_bytes = size;
    if (o->attr->cache.depth == 2 && out->l2_bytes == 0) out->l2_bytes = size;
    if (o->attr->cache.depth == 3 && out->l3_bytes == 0) {
      out->l3_bytes = size;
      out->l3_cores = hwloc_get_nbobjs_by_type(t->topo, HWLOC_OBJ_CORE) > 0
                          ? hwloc_get_nbobjs_inside_cpuset_by_type(t->topo, o->cpuset, HWLOC_OBJ_CORE)
                          : hwloc_get_nbobjs_inside_cpuset_by_type(t->topo, o->cpuset, HWLOC_OBJ_PU);
    }
  }
}

int uattn_topo_bind_thread(const uattn_topo *t, hwloc_const_bitmap_t set) {
  return hwloc_set_cpubind(t->topo, set, HWLOC_CPUBIND_THREAD) == 0 ? 0 : (errno ? errno : EINVAL);
}
