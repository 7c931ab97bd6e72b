/* Memory for KV caches on 2 MiB pages (uattn_cache_alloc in uattn.h). */
#define _DEFAULT_SOURCE /* MADV_HUGEPAGE, MAP_ANONYMOUS */
#include <stdint.h>
#include <sys/mman.h>

#include "internal.h"

#define HUGE_PAGE ((size_t)2 << 20)

/* bytes rounded up to whole huge pages; false when that does not fit a size_t. */
static bool huge_page_bytes(size_t bytes, size_t *rounded) {
  if (bytes > SIZE_MAX - (HUGE_PAGE - 1)) return false;
  *rounded = (bytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
  return true;
}

uattn_status uattn_cache_alloc(size_t bytes, void **out) {
  uattn_clear_error();
  UATTN_CHECK_PTR(out, "uattn_cache_alloc: out");
  if (bytes == 0) return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "uattn_cache_alloc: bytes is 0 (the cache's size)");
  size_t size;
  if (!huge_page_bytes(bytes, &size) || size > SIZE_MAX - HUGE_PAGE)
    return uattn_fail(UATTN_ERR_OVERFLOW, "uattn_cache_alloc: %zu bytes in whole 2 MiB pages overflow a size_t",
                      bytes);
  /* a huge page more than needed, so that a 2 MiB-aligned range of `size` lies inside; the rest goes back */
  char *map = mmap(NULL, size + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED)
    return uattn_fail(UATTN_ERR_NO_MEMORY, "uattn_cache_alloc: the system refused %zu bytes (mmap)",
                      size + HUGE_PAGE);
  char *start = (char *)(((uintptr_t)map + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
  char *end = map + size + HUGE_PAGE;
  if (start > map) munmap(map, (size_t)(start - map));
  if (start + size < end) munmap(start + size, (size_t)(end - (start + size)));
#if defined(MADV_HUGEPAGE)
  /* a request only: refused (THP off, an old kernel), the range stays on 4 KiB pages and works the same */
  (void)madvise(start, size, MADV_HUGEPAGE);
#endif
  *out = start;
  return UATTN_OK;
}

void uattn_cache_free(void *ptr, size_t bytes) {
  size_t size;
  if (ptr && bytes > 0 && huge_page_bytes(bytes, &size)) munmap(ptr, size);
}
