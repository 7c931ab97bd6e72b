/* Tuning files inside a runtime (include/uattn.h, the tuning section): the table a runtime holds and its
 * lookups, the public calls on a runtime and the report. The file itself, this machine's identity, the reader
 * and the writer, is tuning_file.c's.
 *
 * A runtime's table is published through an atomic pointer, so the forward's lookup takes no lock. A load
 * replaces it under the state's mutex and keeps the old table on a retired list until the runtime is
 * destroyed: a lookup that raced with the load still holds a valid pointer. Use counts are atomics in the
 * table's slots; lookups for buckets without an entry are counted in a small lock-free set of keys. */
#include "tuning/tuning.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/kernel_choice.h"
#include "convert.h"
#include "threads/runtime_impl.h"
#include "tuning/tuning_file.h"

#define MISS_SLOTS 64 /* distinct buckets without an entry that the report can list */

struct uattn_tuning_state {
  pthread_mutex_t lock; /* loads, reports and info; never taken by uattn_tuning_find */
  _Atomic(tuning_table *) table;
  tuning_table *retired;
  uattn_alloc alloc;
  bool from_env;
  uattn_status last_status;
  char message[512];
  /* buckets looked up without an entry: a packed key (0 = free slot) and its count */
  _Atomic uint64_t miss_key[MISS_SLOTS];
  _Atomic int64_t miss_uses[MISS_SLOTS];
};

/* ---- the report's text ------------------------------------------------------------------------------- */

/* A growable string for the report and messages (malloc: temporary, never kept by the runtime). */
typedef struct strbuf {
  char *data;
  size_t len, cap;
  bool failed;
} strbuf;

static void sb_printf(strbuf *b, const char *fmt, ...) UATTN_PRINTF(2, 3);
static void sb_printf(strbuf *b, const char *fmt, ...) {
  if (b->failed) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    const size_t room = b->cap - b->len;
    const int n = vsnprintf(b->data ? b->data + b->len : NULL, b->data ? room : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->failed = true;
      return;
    }
    if (b->data && (size_t)n < room) {
      b->len += (size_t)n;
      return;
    }
    const size_t want = b->len + (size_t)n + 1, cap = want > 2 * b->cap ? want : 2 * b->cap;
    char *p = realloc(b->data, cap);
    if (!p) {
      b->failed = true;
      return;
    }
    b->data = p;
    b->cap = cap;
  }
}

/* ---- the runtime's table ----------------------------------------------------------------------------- */

static void clear_misses(uattn_tuning_state *s) {
  for (int i = 0; i < MISS_SLOTS; i++) {
    atomic_store_explicit(&s->miss_uses[i], 0, memory_order_relaxed);
    atomic_store_explicit(&s->miss_key[i], 0, memory_order_relaxed);
  }
}

/* Publishes t (NULL = the defaults); the old table is retired, not freed. Under s->lock. */
static void publish(uattn_tuning_state *s, tuning_table *t) {
  tuning_table *old = atomic_exchange_explicit(&s->table, t, memory_order_acq_rel);
  if (old) {
    old->next_retired = s->retired;
    s->retired = old;
  }
  clear_misses(s);
}

/* Loads path (NULL: back to the defaults) into s. Under s->lock. On a refusal sets s->message and the
 * thread's error. */
static uattn_status load_locked(uattn_tuning_state *s, const char *path, bool from_env) {
  s->from_env = from_env;
  if (!path) {
    publish(s, NULL);
    s->last_status = UATTN_OK;
    s->message[0] = '\0';
    return UATTN_OK;
  }
  char why[400];
  uattn_json_reader r = {.phrasing = UATTN_JSON_LIBRARY, .why = why, .cap = sizeof why};
  tuning_table *t = NULL;
  const uattn_status st = uattn_tuning_parse_file(&r, &s->alloc, path, &t);
  if (st == UATTN_OK) {
    publish(s, t);
    s->last_status = UATTN_OK;
    s->message[0] = '\0';
    return UATTN_OK;
  }
  const tuning_table *kept = atomic_load_explicit(&s->table, memory_order_acquire);
  char keeps[560];
  if (kept)
    snprintf(keeps, sizeof keeps, "the tuning from \"%s\" stays in use", kept->file);
  else
    snprintf(keeps, sizeof keeps, "the library defaults stay in use");
  s->last_status = st;
  char message[1200];
  snprintf(message, sizeof message, "tuning file \"%s\" refused: %s; %s", path, why, keeps);
  copy_text(s->message, sizeof s->message, message);
  return uattn_fail(st, "%s", s->message);
}

uattn_status uattn_tuning_runtime_init(uattn_runtime *rt) {
  uattn_tuning_state *s = uattn_alloc_bytes(&rt->alloc, sizeof *s);
  if (!s) return uattn_fail(UATTN_ERR_NO_MEMORY, "out of memory creating a runtime");
  memset(s, 0, sizeof *s);
  uattn_alloc_init(&s->alloc, &rt->alloc.hooks);
  pthread_mutex_init(&s->lock, NULL);
  atomic_init(&s->table, NULL);
  rt->tuning = s;
  const char *env = getenv("UATTN_TUNING_FILE");
  if (env && *env) {
    pthread_mutex_lock(&s->lock);
    const uattn_status st = load_locked(s, env, true);
    pthread_mutex_unlock(&s->lock);
    if (st == UATTN_ERR_NO_MEMORY) return st;
    uattn_clear_error(); /* a refused file does not fail creation: the report says why (uattn.h) */
  }
  return UATTN_OK;
}

void uattn_tuning_runtime_release(uattn_runtime *rt) {
  uattn_tuning_state *s = rt ? rt->tuning : NULL;
  if (!s) return;
  publish(s, NULL);
  for (tuning_table *t = s->retired, *next; t; t = next) {
    next = t->next_retired;
    uattn_alloc_release(&s->alloc, t, t->bytes);
  }
  pthread_mutex_destroy(&s->lock);
  rt->tuning = NULL;
  uattn_alloc_release(&rt->alloc, s, sizeof *s);
}

static uint64_t miss_key(int32_t block_size, int32_t head_dim, uattn_dtype dtype) {
  return (uint64_t)(uint32_t)block_size << 32 | (uint64_t)((uint32_t)head_dim & 0xFFFFFFu) << 8 |
         (((uint32_t)dtype & 0x7Fu) | 0x80u);
}

static void count_miss(uattn_tuning_state *s, int32_t block_size, int32_t head_dim, uattn_dtype dtype) {
  const uint64_t key = miss_key(block_size, head_dim, dtype);
  for (int i = 0; i < MISS_SLOTS; i++) {
    uint64_t k = atomic_load_explicit(&s->miss_key[i], memory_order_acquire);
    if (k == 0) {
      uint64_t expected = 0;
      if (atomic_compare_exchange_strong_explicit(&s->miss_key[i], &expected, key, memory_order_acq_rel,
                                                  memory_order_acquire))
        k = key;
      else
        k = expected;
    }
    if (k == key) {
      atomic_fetch_add_explicit(&s->miss_uses[i], 1, memory_order_relaxed);
      return;
    }
  }
}

static tuning_slot *find_slot(const tuning_table *t, int32_t block_size, int32_t head_dim, uattn_dtype dtype) {
  for (int32_t i = 0; t && i < t->num_entries; i++)
    if (same_bucket(&t->slots[i].entry, block_size, head_dim, dtype)) return &t->slots[i];
  return NULL;
}

/* The slot for a bucket, counted as one use (or one use of the defaults). */
static const uattn_tuning_entry *use_bucket(uattn_tuning_state *s, int32_t block_size, int32_t head_dim,
                                            uattn_dtype dtype) {
  tuning_slot *slot = find_slot(atomic_load_explicit(&s->table, memory_order_acquire), block_size, head_dim, dtype);
  if (!slot) {
    count_miss(s, block_size, head_dim, dtype);
    return NULL;
  }
  atomic_fetch_add_explicit(&slot->uses, 1, memory_order_relaxed);
  return &slot->entry;
}

const uattn_tuning_entry *uattn_tuning_find(const uattn_runtime *rt, int32_t block_size, int32_t head_dim,
                                            uattn_dtype cache_dtype) {
  if (!rt || !rt->tuning) return NULL;
  return use_bucket(rt->tuning, block_size, head_dim, cache_dtype);
}

/* ---- public calls on a runtime ------------------------------------------------------------------------ */

#define CHECK_RUNTIME(rt)                                                                                              \
  do {                                                                                                                 \
    UATTN_CHECK_PTR(rt, "rt");                                                                                         \
    if (!(rt)->tuning) return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "rt is not a runtime in use");                    \
  } while (0)

static uattn_status check_bucket(int32_t block_size, int32_t head_dim, uattn_dtype dtype) {
  if (block_size <= 0) return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "block_size %d must be > 0", block_size);
  if (head_dim <= 0) return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "head_dim %d must be > 0", head_dim);
  if (!uattn_dtype_valid(dtype))
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "cache_dtype %d is not a uattn_dtype", (int)dtype);
  return UATTN_OK;
}

uattn_status uattn_runtime_load_tuning(uattn_runtime *rt, const char *path) {
  uattn_clear_error();
  CHECK_RUNTIME(rt);
  if (path && !*path) return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "path is empty (NULL drops the tuning)");
  pthread_mutex_lock(&rt->tuning->lock);
  const uattn_status st = load_locked(rt->tuning, path, false);
  pthread_mutex_unlock(&rt->tuning->lock);
  return st;
}

uattn_status uattn_runtime_tuning_info(const uattn_runtime *rt, uattn_tuning_info *out) {
  uattn_clear_error();
  CHECK_RUNTIME(rt);
  UATTN_CHECK_PTR(out, "out");
  uattn_tuning_state *s = rt->tuning;
  uattn_tuning_info info;
  memset(&info, 0, sizeof info);
  pthread_mutex_lock(&s->lock);
  const tuning_table *t = atomic_load_explicit(&s->table, memory_order_acquire);
  info.loaded = t != NULL;
  info.from_env = s->from_env;
  info.num_entries = t ? t->num_entries : 0;
  copy_text(info.file, sizeof info.file, t ? t->file : "");
  info.last_status = s->last_status;
  copy_text(info.message, sizeof info.message, s->message);
  pthread_mutex_unlock(&s->lock);
  *out = info;
  return UATTN_OK;
}

static void report_value(strbuf *b, int32_t v) {
  if (v)
    sb_printf(b, " %10d", v);
  else
    sb_printf(b, " %10s", "default");
}

static void build_report(uattn_tuning_state *s, strbuf *b) {
  const tuning_table *t = atomic_load_explicit(&s->table, memory_order_acquire);
  if (t) {
    sb_printf(b, "uattn tuning: %d entr%s from \"%s\"%s\n", t->num_entries, t->num_entries == 1 ? "y" : "ies", t->file,
              s->from_env && s->last_status == UATTN_OK ? " ($UATTN_TUNING_FILE)" : "");
    sb_printf(b, "  tuned %s with uattn %s on %s \"%s\", kernel set %s\n", t->date, t->host.uattn_version,
              t->host.cpu_vendor, t->host.cpu_model, t->host.kernel_set);
    sb_printf(b, "  workload: %s\n", t->workload);
    sb_printf(b, "  %-30s %10s %10s %10s %10s %10s %10s\n", "bucket", "chunk", "query_tile", "split_min", "split_keys",
              "threads", "uses");
    for (int32_t i = 0; i < t->num_entries; i++) {
      const uattn_tuning_entry *e = &t->slots[i].entry;
      char bucket[64];
      snprintf(bucket, sizeof bucket, "block %d, head_dim %d, %s", e->block_size, e->head_dim,
               uattn_dtype_name(e->cache_dtype));
      sb_printf(b, "  %-30s", bucket);
      report_value(b, e->chunk_size);
      report_value(b, e->query_tile);
      report_value(b, e->split_min_keys);
      report_value(b, e->split_keys);
      report_value(b, e->num_threads);
      sb_printf(b, " %10lld\n", (long long)atomic_load_explicit(&t->slots[i].uses, memory_order_relaxed));
    }
  } else {
    sb_printf(b, "uattn tuning: the library defaults (no tuning file in use%s)\n",
              s->last_status == UATTN_OK ? "; set UATTN_TUNING_FILE or call uattn_runtime_load_tuning" : "");
  }
  if (s->last_status != UATTN_OK)
    sb_printf(b, "  the last file%s was refused (%s): %s\n", s->from_env ? " (from $UATTN_TUNING_FILE)" : "",
              uattn_status_name(s->last_status), s->message);
  bool header = false;
  for (int i = 0; i < MISS_SLOTS; i++) {
    const uint64_t k = atomic_load_explicit(&s->miss_key[i], memory_order_acquire);
    const long long uses = (long long)atomic_load_explicit(&s->miss_uses[i], memory_order_relaxed);
    if (!k || !uses) continue;
    if (!header) sb_printf(b, "  buckets that ran on the defaults (no entry):\n");
    header = true;
    sb_printf(b, "    block %u, head_dim %u, %s: %lld use%s\n", (unsigned)(k >> 32), (unsigned)((k >> 8) & 0xFFFFFFu),
              uattn_dtype_name((uattn_dtype)(k & 0x7Fu)), uses, uses == 1 ? "" : "s");
  }
}

uattn_status uattn_runtime_tuning_report(const uattn_runtime *rt, char *buf, size_t cap, size_t *length) {
  uattn_clear_error();
  CHECK_RUNTIME(rt);
  UATTN_CHECK_PTR(length, "length");
  if (!buf && cap) return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "buf is NULL but cap is %zu", cap);
  strbuf b = {0};
  pthread_mutex_lock(&rt->tuning->lock);
  build_report(rt->tuning, &b);
  pthread_mutex_unlock(&rt->tuning->lock);
  if (b.failed) {
    free(b.data);
    return uattn_fail(UATTN_ERR_NO_MEMORY, "out of memory writing the tuning report");
  }
  uattn_status st = UATTN_OK;
  if (buf && cap <= b.len) {
    st = uattn_fail(UATTN_ERR_CAPACITY, "the tuning report needs %zu bytes (NUL included), cap is %zu", b.len + 1, cap);
  } else {
    if (buf) memcpy(buf, b.data, b.len + 1);
    *length = b.len;
  }
  free(b.data);
  return st;
}

uattn_status uattn_runtime_tuning_lookup(const uattn_runtime *rt, int32_t block_size, int32_t head_dim,
                                         uattn_dtype cache_dtype, uattn_tuning_entry *out, bool *found) {
  uattn_clear_error();
  CHECK_RUNTIME(rt);
  UATTN_CHECK_PTR(out, "out");
  uattn_status st = check_bucket(block_size, head_dim, cache_dtype);
  if (st != UATTN_OK) return st;
  const tuning_slot *slot =
      find_slot(atomic_load_explicit(&rt->tuning->table, memory_order_acquire), block_size, head_dim, cache_dtype);
  if (slot) {
    *out = slot->entry;
  } else {
    memset(out, 0, sizeof *out);
    out->block_size = block_size;
    out->head_dim = head_dim;
    out->cache_dtype = cache_dtype;
  }
  if (found) *found = slot != NULL;
  return UATTN_OK;
}

uattn_status uattn_runtime_tuned_plan_config(const uattn_runtime *rt, int32_t head_dim, uattn_dtype cache_dtype,
                                             uattn_plan_config *config) {
  uattn_clear_error();
  CHECK_RUNTIME(rt);
  UATTN_CHECK_PTR(config, "config");
  uattn_status st = check_bucket(config->block_size, head_dim, cache_dtype);
  if (st != UATTN_OK) return st;
  const uattn_tuning_entry *e = use_bucket(rt->tuning, config->block_size, head_dim, cache_dtype);
  if (!e) return UATTN_OK;
  const uattn_plan_config d = uattn_plan_config_default(1, 1, 1, 1, 1);
  if (e->split_min_keys && (config->split_min_keys == 0 || config->split_min_keys == d.split_min_keys))
    config->split_min_keys = e->split_min_keys;
  if (e->split_keys && (config->split_keys == 0 || config->split_keys == d.split_keys))
    config->split_keys = e->split_keys;
  return UATTN_OK;
}

uattn_status uattn_runtime_tuned_layer(const uattn_runtime *rt, int32_t block_size, uattn_layer *layer) {
  uattn_clear_error();
  CHECK_RUNTIME(rt);
  UATTN_CHECK_PTR(layer, "layer");
  const int32_t head_dim = layer_dims(layer).kernel; /* the bucket's, as the forward looks it up */
  uattn_status st = check_bucket(block_size, head_dim, layer->cache_dtype);
  if (st != UATTN_OK) return st;
  const uattn_tuning_entry *e = use_bucket(rt->tuning, block_size, head_dim, layer->cache_dtype);
  if (!e) return UATTN_OK;
  if (layer->causal_width == 0) layer->causal_width = e->query_tile;
  if (layer->chunk_size == 0) layer->chunk_size = e->chunk_size;
  return UATTN_OK;
}
