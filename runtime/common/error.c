/* Status names and the thread-local error message behind uattn_last_error(). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"

static _Thread_local char last_error[512];

uattn_status uattn_fail(uattn_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return status;
}

void uattn_clear_error(void) { last_error[0] = '\0'; }

const char *uattn_last_error(void) { return last_error; }

const char *uattn_status_name(uattn_status status) {
  switch (status) {
  case UATTN_OK: return "UATTN_OK";
  case UATTN_ERR_INVALID_ARGUMENT: return "UATTN_ERR_INVALID_ARGUMENT";
  case UATTN_ERR_OUT_OF_RANGE: return "UATTN_ERR_OUT_OF_RANGE";
  case UATTN_ERR_INCONSISTENT: return "UATTN_ERR_INCONSISTENT";
  case UATTN_ERR_CAPACITY: return "UATTN_ERR_CAPACITY";
  case UATTN_ERR_OVERFLOW: return "UATTN_ERR_OVERFLOW";
  case UATTN_ERR_TOO_LARGE: return "UATTN_ERR_TOO_LARGE";
  case UATTN_ERR_NO_MEMORY: return "UATTN_ERR_NO_MEMORY";
  case UATTN_ERR_UNSUPPORTED: return "UATTN_ERR_UNSUPPORTED";
  }
  return "UATTN_ERR_UNKNOWN";
}

#define UATTN_STR2(x) #x
#define UATTN_STR(x) UATTN_STR2(x)
const char *uattn_version(void) {
  return UATTN_STR(UATTN_VERSION_MAJOR) "." UATTN_STR(UATTN_VERSION_MINOR) "." UATTN_STR(UATTN_VERSION_PATCH);
}

/* ---- allocation ---------------------------------------------------------------------------------- */

static void *default_alloc(void *user, size_t bytes) {
  (void)user;
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
  return p;
}

static void default_free(void *user, void *ptr) {
  (void)user;
  free(ptr);
}

uattn_status uattn_alloc_init(uattn_alloc *a, const uattn_allocator *hooks) {
  memset(a, 0, sizeof *a);
  if (hooks && (hooks->alloc != NULL) != (hooks->free != NULL))
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "allocator: give both alloc and free, or neither");
  if (hooks && hooks->alloc) {
    a->hooks = *hooks;
  } else {
    a->hooks.alloc = default_alloc;
    a->hooks.free = default_free;
  }
  return UATTN_OK;
}

void *uattn_alloc_bytes(uattn_alloc *a, size_t bytes) {
  void *p = a->hooks.alloc(a->hooks.user, bytes);
  if (p) {
    a->count++;
    a->bytes += bytes;
  }
  return p;
}

void uattn_alloc_release(uattn_alloc *a, void *ptr, size_t bytes) {
  if (!ptr) return;
  a->hooks.free(a->hooks.user, ptr);
  a->bytes -= bytes;
}

uattn_status uattn_buf_reserve(uattn_alloc *a, uattn_buf *buf, size_t bytes) {
  if (bytes <= buf->bytes) return UATTN_OK;
  size_t grown = buf->bytes + buf->bytes / 2;
  size_t want = bytes > grown ? bytes : grown;
  void *p = uattn_alloc_bytes(a, want);
  if (!p) return uattn_fail(UATTN_ERR_NO_MEMORY, "out of memory reserving %zu bytes", want);
  uattn_buf_release(a, buf);
  buf->data = p;
  buf->bytes = want;
  return UATTN_OK;
}

void uattn_buf_release(uattn_alloc *a, uattn_buf *buf) {
  uattn_alloc_release(a, buf->data, buf->bytes);
  buf->data = NULL;
  buf->bytes = 0;
}
