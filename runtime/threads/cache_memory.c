/* Memory for KV caches on 2 MiB pages (uattn_cache_alloc in uattn.h), and spread over a runtime's NUMA nodes
 * (uattn_runtime_cache_alloc). */
#define _DEFAULT_SOURCE /* MADV_HUGEPAGE, MAP_ANONYMOUS */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "common/internal.h"
#include "threads/runtime_impl.h"

#define HUGE_PAGE ((size_t)2 << 20)

/* bytes rounded up to whole huge pages; false when that does not fit a size_t. */
static bool huge_page_bytes(size_t bytes, size_t *rounded) {
  if (bytes > SIZE_MAX - (HUGE_PAGE - 1)) return false;
  *rounded = (bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
  return true;
}

/* The mapping of uattn_cache_alloc, in *start and *size (the rounded bytes); `who` names the call. Nothing
 * has touched its pages yet, so a placement policy set now decides where each one goes. */
static uattn_status map_cache(const char *who, size_t bytes, char **start_out, size_t *size_out) {
  if (bytes == 0) return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "%s: bytes is 0 (the cache's size)", who);
  size_t size = 0;
  if (!huge_page_bytes(bytes, &size) || size > SIZE_MAX - HUGE_PAGE)
    return uattn_fail(UATTN_ERR_OVERFLOW, "%s: %zu bytes in whole 2 MiB pages overflow a size_t", who, bytes);
  /* a huge page more than needed, so that a 2 MiB-aligned range of `size` lies inside; the rest goes back */
  char *map = mmap(NULL, size + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED)
    return uattn_fail(UATTN_ERR_NO_MEMORY, "%s: the system refused %zu bytes (mmap)", who, size + HUGE_PAGE);
  char *start = (char *)(((uintptr_t)map + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
  char *end = map + size + HUGE_PAGE;
  if (start > map) munmap(map, (size_t)(start - map));
  if (start + size < end) munmap(start + size, (size_t)(end - (start + size)));
#if defined(MADV_HUGEPAGE)
  /* a request only: refused (THP off, an old kernel), the range stays on 4 KiB pages and works the same */
  (void)madvise(start, size, MADV_HUGEPAGE);
#endif
  *start_out = start;
  *size_out = size;
  return UATTN_OK;
}

uattn_status uattn_cache_alloc(size_t bytes, void **out) {
  uattn_clear_error();
  UATTN_CHECK_PTR(out, "uattn_cache_alloc: out");
  char *start = NULL;
  size_t size = 0;
  const uattn_status st = map_cache("uattn_cache_alloc", bytes, &start, &size);
  if (st == UATTN_OK) *out = start;
  return st;
}

uattn_status uattn_runtime_cache_alloc(const uattn_runtime *rt, size_t bytes, void **out) {
  uattn_clear_error();
  UATTN_CHECK_PTR(rt, "uattn_runtime_cache_alloc: rt");
  UATTN_CHECK_PTR(out, "uattn_runtime_cache_alloc: out");
  const uattn_topo *t = &rt->topo;
  hwloc_nodeset_t nodes = hwloc_bitmap_alloc();
  if (!nodes) return uattn_fail(UATTN_ERR_NO_MEMORY, "out of memory in uattn_runtime_cache_alloc");
  hwloc_cpuset_to_nodeset(t->topo, t->usable, nodes);
  char *start = NULL;
  size_t size = 0;
  uattn_status st = map_cache("uattn_runtime_cache_alloc", bytes, &start, &size);
  /* set before anything touches the pages; where no node of the runtime's cores is known (hwloc reports one
   * wherever it can), first touch places them */
  if (st == UATTN_OK && !hwloc_bitmap_iszero(nodes) &&
      hwloc_set_area_membind(t->topo, start, size, nodes, HWLOC_MEMBIND_INTERLEAVE, HWLOC_MEMBIND_BYNODESET) < 0) {
    const int err = errno;
    munmap(start, size);
    char list[128];
    hwloc_bitmap_list_snprintf(list, sizeof list, nodes);
    st = uattn_fail(UATTN_ERR_UNSUPPORTED,
                    "uattn_runtime_cache_alloc: the system refused to interleave the pages over NUMA nodes %s "
                    "(mbind: %s); uattn_cache_alloc gives the same memory placed by first touch",
                    list, strerror(err));
  }
  hwloc_bitmap_free(nodes);
  if (st == UATTN_OK) *out = start;
  return st;
}

void uattn_cache_free(void *ptr, size_t bytes) {
  size_t size = 0;
  if (ptr && bytes > 0 && huge_page_bytes(bytes, &size)) munmap(ptr, size);
}
