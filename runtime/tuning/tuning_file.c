/* Tuning files (include/uattn.h, the tuning section) as files: this machine's identity that a file is made
 * for, an entry's fields and their checks, the reader that turns a file into a runtime's table and the writer
 * that uattn-sweep calls; apart from tuning.c because none of it touches a runtime's live table. */
#include "tuning/tuning_file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "convert.h"

#define TUNING_FORMAT_NAME "uattn-tuning"
#define TUNING_MAX_FILE_BYTES ((size_t)16 << 20)
#define TUNING_MS_LIMIT 1e15 /* tuned_ms and default_ms are below it */

/* ---- small helpers ----------------------------------------------------------------------------------- */

/* Copies src into dst[cap], trimmed, runs of white space made one space. */
static void copy_normalized(char *dst, size_t cap, const char *src) {
  size_t n = 0;
  bool space = false;
  for (const char *p = src; *p && n + 1 < cap; p++) {
    const bool ws = *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r';
    if (ws) {
      space = n > 0;
      continue;
    }
    if (space && n + 2 < cap) dst[n++] = ' ';
    space = false;
    dst[n++] = *p;
  }
  dst[n] = '\0';
}

/* ---- this machine ---------------------------------------------------------------------------------- */

/* The value of the first "key : value" line of /proc/cpuinfo whose key is one of keys, into out. */
static bool cpuinfo_value(const char *const *keys, int num_keys, char *out, size_t cap) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return false;
  char line[512];
  bool found = false;
  while (!found && fgets(line, sizeof line, f)) {
    char *colon = strchr(line, ':');
    if (!colon) continue;
    *colon = '\0';
    char key[128];
    copy_normalized(key, sizeof key, line);
    for (int i = 0; i < num_keys && !found; i++)
      if (!strcmp(key, keys[i])) {
        copy_normalized(out, cap, colon + 1);
        found = *out != '\0';
      }
  }
  fclose(f);
  return found;
}

static void detect_cpu(uattn_tuning_host *h) {
  h->cpu_vendor[0] = h->cpu_model[0] = '\0';
#if defined(__x86_64__) || defined(__i386__)
  unsigned a, b, c, d;
  if (__get_cpuid(0, &a, &b, &c, &d)) {
    char v[13];
    memcpy(v, &b, 4);
    memcpy(v + 4, &d, 4);
    memcpy(v + 8, &c, 4);
    v[12] = '\0';
    copy_normalized(h->cpu_vendor, sizeof h->cpu_vendor, v);
  }
  if (__get_cpuid(0x80000000u, &a, &b, &c, &d) && a >= 0x80000004u) {
    unsigned regs[12];
    for (unsigned i = 0; i < 3; i++)
      __get_cpuid(0x80000002u + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
    char brand[49];
    memcpy(brand, regs, 48);
    brand[48] = '\0';
    copy_normalized(h->cpu_model, sizeof h->cpu_model, brand);
  }
#endif
  static const char *const vendor_keys[] = {"vendor_id", "CPU implementer", "vendor"};
  static const char *const model_keys[] = {"model name", "Processor", "cpu model", "cpu", "CPU part"};
  if (!h->cpu_vendor[0] && !cpuinfo_value(vendor_keys, 3, h->cpu_vendor, sizeof h->cpu_vendor))
    snprintf(h->cpu_vendor, sizeof h->cpu_vendor, "unknown");
  if (!h->cpu_model[0] && !cpuinfo_value(model_keys, 5, h->cpu_model, sizeof h->cpu_model))
    snprintf(h->cpu_model, sizeof h->cpu_model, "unknown");
}

uattn_status uattn_tuning_host_get(uattn_tuning_host *out) {
  uattn_clear_error();
  UATTN_CHECK_PTR(out, "out");
  memset(out, 0, sizeof *out);
  detect_cpu(out);
  copy_text(out->kernel_set, sizeof out->kernel_set, uattn_kernel_set(NULL));
  copy_text(out->uattn_version, sizeof out->uattn_version, uattn_version());
  return UATTN_OK;
}

/* ---- entries ----------------------------------------------------------------------------------------- */

/* The integer fields of an entry with their ranges, for the checks, the reader and the writer. */
typedef struct int_field {
  const char *key;
  size_t offset;
  int64_t lo, hi;
  bool required;
} int_field;

static const int_field int_fields[] = {
    {"block_size", offsetof(uattn_tuning_entry, block_size), 1, UATTN_TUNING_MAX_BLOCK_SIZE, true},
    {"head_dim", offsetof(uattn_tuning_entry, head_dim), 1, UATTN_TUNING_MAX_HEAD_DIM, true},
    {"chunk_size", offsetof(uattn_tuning_entry, chunk_size), 0, UATTN_TUNING_MAX_TILE, false},
    {"query_tile", offsetof(uattn_tuning_entry, query_tile), 0, UATTN_TUNING_MAX_TILE, false},
    {"split_min_keys", offsetof(uattn_tuning_entry, split_min_keys), 0, INT32_MAX, false},
    {"split_keys", offsetof(uattn_tuning_entry, split_keys), 0, INT32_MAX, false},
    {"num_threads", offsetof(uattn_tuning_entry, num_threads), 0, UATTN_RUNTIME_MAX_THREADS, false},
};
#define NUM_INT_FIELDS ((int)(sizeof int_fields / sizeof *int_fields))
static const char *const time_fields[] = {"tuned_ms", "default_ms"};

static int32_t *field_ptr(uattn_tuning_entry *e, const int_field *f) { return (int32_t *)((char *)e + f->offset); }
static int32_t field_value(const uattn_tuning_entry *e, const int_field *f) {
  return *(const int32_t *)((const char *)e + f->offset);
}

/* Checks entries[0..n) as the loader does; the reason into why. */
static uattn_status check_entries(const uattn_tuning_entry *entries, int32_t n, char *why, size_t cap) {
  for (int32_t i = 0; i < n; i++) {
    const uattn_tuning_entry *e = &entries[i];
    for (int k = 0; k < NUM_INT_FIELDS; k++) {
      const int32_t v = field_value(e, &int_fields[k]);
      if (v < int_fields[k].lo || v > int_fields[k].hi) {
        snprintf(why, cap, "entries[%d].%s = %d is out of range [%lld, %lld]", i, int_fields[k].key, v,
                 (long long)int_fields[k].lo, (long long)int_fields[k].hi);
        return UATTN_ERR_OUT_OF_RANGE;
      }
    }
    if (!uattn_dtype_valid(e->cache_dtype)) {
      snprintf(why, cap, "entries[%d].cache_dtype %d is not a uattn_dtype", i, (int)e->cache_dtype);
      return UATTN_ERR_OUT_OF_RANGE;
    }
    if (!(e->tuned_ms >= 0 && e->tuned_ms < TUNING_MS_LIMIT) ||
        !(e->default_ms >= 0 && e->default_ms < TUNING_MS_LIMIT)) {
      snprintf(why, cap, "entries[%d]: tuned_ms and default_ms must be finite and >= 0", i);
      return UATTN_ERR_OUT_OF_RANGE;
    }
    for (int32_t j = 0; j < i; j++)
      if (same_bucket(&entries[j], e->block_size, e->head_dim, e->cache_dtype)) {
        snprintf(why, cap, "entries[%d] and entries[%d] are both for block_size %d, head_dim %d, %s", j, i,
                 e->block_size, e->head_dim, uattn_dtype_name(e->cache_dtype));
        return UATTN_ERR_INVALID_ARGUMENT;
      }
  }
  return UATTN_OK;
}

/* ---- reading a file ---------------------------------------------------------------------------------- */

static uattn_status read_entry(uattn_json_reader *r, const cJSON *x, int index, uattn_tuning_entry *e) {
  char path[40], where[48]; /* where: path and a dot */
  snprintf(path, sizeof path, "entries[%d]", index);
  snprintf(where, sizeof where, "%s.", path);
  if (uattn_json_expect(r, x, path, false, "an object") != UATTN_OK) return r->status;
  const char *known[NUM_INT_FIELDS + 3];
  for (int k = 0; k < NUM_INT_FIELDS; k++) known[k] = int_fields[k].key;
  known[NUM_INT_FIELDS] = "cache_dtype";
  known[NUM_INT_FIELDS + 1] = time_fields[0];
  known[NUM_INT_FIELDS + 2] = time_fields[1];
  uattn_status st = uattn_json_check_keys(r, x, where, known, NUM_INT_FIELDS + 3);
  if (st != UATTN_OK) return st;
  memset(e, 0, sizeof *e);
  for (int k = 0; k < NUM_INT_FIELDS && st == UATTN_OK; k++) {
    const int_field *f = &int_fields[k];
    st = uattn_json_int(r, x, where, f->key, f->required, 0, f->lo, f->hi, field_ptr(e, f));
  }
  if (st == UATTN_OK) st = uattn_json_dtype(r, x, where, "cache_dtype", false, true, &e->cache_dtype);
  for (int k = 0; k < 2 && st == UATTN_OK; k++)
    if (cJSON_GetObjectItemCaseSensitive(x, time_fields[k]))
      st = uattn_json_number(r, x, where, time_fields[k], 0, nextafter(TUNING_MS_LIMIT, 0),
                             k ? &e->default_ms : &e->tuned_ms);
  return st;
}

/* The checks that make a file stale on this machine. */
static uattn_status check_host(uattn_json_reader *r, const cJSON *root, uattn_tuning_host *file_host) {
  uattn_tuning_host here;
  uattn_tuning_host_get(&here);
  const char *version, *vendor, *model, *kernels;
  uattn_status st = uattn_json_string(r, root, "", "uattn_version", &version);
  if (st != UATTN_OK) return st;
  const cJSON *cpu = cJSON_GetObjectItemCaseSensitive(root, "cpu");
  static const char *const cpu_keys[] = {"vendor", "model", "kernel_set"};
  if ((st = uattn_json_expect(r, cpu, "cpu", false, "an object")) != UATTN_OK ||
      (st = uattn_json_check_keys(r, cpu, "cpu.", cpu_keys, 3)) != UATTN_OK ||
      (st = uattn_json_string(r, cpu, "cpu.", "vendor", &vendor)) != UATTN_OK ||
      (st = uattn_json_string(r, cpu, "cpu.", "model", &model)) != UATTN_OK ||
      (st = uattn_json_string(r, cpu, "cpu.", "kernel_set", &kernels)) != UATTN_OK)
    return st;
  copy_normalized(file_host->uattn_version, sizeof file_host->uattn_version, version);
  copy_normalized(file_host->cpu_vendor, sizeof file_host->cpu_vendor, vendor);
  copy_normalized(file_host->cpu_model, sizeof file_host->cpu_model, model);
  copy_normalized(file_host->kernel_set, sizeof file_host->kernel_set, kernels);
  const char *redo = "re-run uattn-sweep here to make a fresh one";
  if (strcmp(file_host->uattn_version, here.uattn_version))
    return uattn_json_refuse(r, UATTN_ERR_INCONSISTENT, "stale: made by uattn %s, this is uattn %s; %s",
                             file_host->uattn_version, here.uattn_version, redo);
  if (strcmp(file_host->cpu_vendor, here.cpu_vendor) || strcmp(file_host->cpu_model, here.cpu_model))
    return uattn_json_refuse(r, UATTN_ERR_INCONSISTENT, "stale: made on another CPU (%s \"%s\"), this is %s \"%s\"; %s",
                             file_host->cpu_vendor, file_host->cpu_model, here.cpu_vendor, here.cpu_model, redo);
  if (strcmp(file_host->kernel_set, here.kernel_set))
    return uattn_json_refuse(r, UATTN_ERR_INCONSISTENT,
                             "stale: made for the %s kernel set, this process runs %s (UATTN_ISA may force one); %s",
                             file_host->kernel_set, here.kernel_set, redo);
  return UATTN_OK;
}

uattn_status uattn_tuning_parse_file(uattn_json_reader *r, uattn_alloc *alloc, const char *path, tuning_table **out) {
  cJSON *root = uattn_json_read_object(r, path, TUNING_MAX_FILE_BYTES);
  if (!root) return r->status;

  tuning_table *t = NULL;
  uattn_tuning_host host;
  memset(&host, 0, sizeof host);
  const char *format;
  int32_t version = 0;
  static const char *const top_keys[] = {"format", "format_version", "uattn_version", "cpu",
                                         "date",   "workload",       "entries"};
  const cJSON *entries = cJSON_GetObjectItemCaseSensitive(root, "entries"),
              *date = cJSON_GetObjectItemCaseSensitive(root, "date");
  uattn_status st;
  if ((st = uattn_json_string(r, root, "", "format", &format)) != UATTN_OK) {
  } else if (strcmp(format, TUNING_FORMAT_NAME)) {
    st = uattn_json_refuse(r, UATTN_ERR_UNSUPPORTED, "format \"%s\" is not \"" TUNING_FORMAT_NAME "\"", format);
  } else if ((st = uattn_json_int(r, root, "", "format_version", true, 0, 0, INT32_MAX, &version)) != UATTN_OK) {
  } else if (version != UATTN_TUNING_FORMAT_VERSION) {
    st = uattn_json_refuse(r, UATTN_ERR_UNSUPPORTED, "format_version %d; this uattn reads version %d", version,
                           UATTN_TUNING_FORMAT_VERSION);
  } else if ((st = uattn_json_check_keys(r, root, "", top_keys, 7)) != UATTN_OK ||
             (st = check_host(r, root, &host)) != UATTN_OK) {
  } else if (date && !cJSON_IsString(date)) {
    st = uattn_json_refuse(r, UATTN_ERR_INVALID_ARGUMENT, "date must be a string, not %s", uattn_json_kind(date));
  } else if (!uattn_json_required(r, root, "", "entries") ||
             uattn_json_expect(r, entries, "entries", true, "an array") != UATTN_OK) {
    st = r->status;
  } else {
    const int32_t n = cJSON_GetArraySize(entries);
    const size_t bytes = sizeof *t + (size_t)n * sizeof(tuning_slot);
    if (!(t = uattn_alloc_bytes(alloc, bytes))) {
      st = uattn_json_refuse(r, UATTN_ERR_NO_MEMORY, "out of memory for %d entries", n);
    } else {
      memset(t, 0, bytes);
      t->bytes = bytes;
      t->num_entries = n;
      t->slots = (tuning_slot *)(t + 1);
      t->host = host;
      copy_text(t->file, sizeof t->file, path);
      copy_text(t->date, sizeof t->date, date ? date->valuestring : "unknown");
      const cJSON *workload = cJSON_GetObjectItemCaseSensitive(root, "workload");
      char *w = workload ? cJSON_PrintUnformatted(workload) : NULL;
      snprintf(t->workload, sizeof t->workload, "%.*s%s", TUNING_WORKLOAD_CHARS, w ? w : "unknown",
               w && strlen(w) > TUNING_WORKLOAD_CHARS ? "..." : "");
      cJSON_free(w);
      int i = 0;
      const cJSON *x;
      cJSON_ArrayForEach(x, entries) {
        if ((st = read_entry(r, x, i, &t->slots[i].entry)) != UATTN_OK) break;
        i++;
      }
      uattn_tuning_entry *plain = st == UATTN_OK ? malloc(sizeof *plain * (size_t)(n ? n : 1)) : NULL;
      if (st == UATTN_OK && !plain)
        st = uattn_json_refuse(r, UATTN_ERR_NO_MEMORY, "out of memory checking %d entries", n);
      if (plain) {
        for (int32_t k = 0; k < n; k++) plain[k] = t->slots[k].entry;
        st = check_entries(plain, n, r->why, r->cap);
        free(plain);
      }
    }
  }
  cJSON_Delete(root);
  if (st != UATTN_OK) {
    if (t) uattn_alloc_release(alloc, t, t->bytes);
    return st;
  }
  *out = t;
  return UATTN_OK;
}

/* ---- writing a file ----------------------------------------------------------------------------------- */

static cJSON *entry_json(const uattn_tuning_entry *e) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  bool ok = cJSON_AddNumberToObject(o, "block_size", e->block_size) &&
            cJSON_AddNumberToObject(o, "head_dim", e->head_dim) &&
            cJSON_AddStringToObject(o, "cache_dtype", uattn_dtype_name(e->cache_dtype));
  for (int k = 2; k < NUM_INT_FIELDS && ok; k++)
    ok = cJSON_AddNumberToObject(o, int_fields[k].key, field_value(e, &int_fields[k])) != NULL;
  const double times[2] = {e->tuned_ms, e->default_ms};
  for (int k = 0; k < 2 && ok; k++)
    if (times[k] > 0) ok = cJSON_AddNumberToObject(o, time_fields[k], round(times[k] * 1e3) / 1e3) != NULL;
  if (!ok) {
    cJSON_Delete(o);
    return NULL;
  }
  return o;
}

/* The whole document, or NULL (out of memory). */
static cJSON *file_json(const uattn_tuning_host *h, const char *date, cJSON *workload,
                        const uattn_tuning_entry *entries, int32_t n) {
  cJSON *root = cJSON_CreateObject(), *cpu = cJSON_CreateObject(), *list = cJSON_CreateArray();
  bool ok = root && cpu && list && cJSON_AddStringToObject(root, "format", TUNING_FORMAT_NAME) &&
            cJSON_AddNumberToObject(root, "format_version", UATTN_TUNING_FORMAT_VERSION) &&
            cJSON_AddStringToObject(root, "uattn_version", h->uattn_version) &&
            cJSON_AddStringToObject(cpu, "vendor", h->cpu_vendor) &&
            cJSON_AddStringToObject(cpu, "model", h->cpu_model) &&
            cJSON_AddStringToObject(cpu, "kernel_set", h->kernel_set);
  if (ok) {
    cJSON_AddItemToObject(root, "cpu", cpu);
    cpu = NULL;
    ok = cJSON_AddStringToObject(root, "date", date) != NULL;
  }
  if (ok) {
    cJSON_AddItemToObject(root, "workload", workload);
    workload = NULL;
    for (int32_t i = 0; i < n && ok; i++) {
      cJSON *e = entry_json(&entries[i]);
      ok = e != NULL;
      if (e) cJSON_AddItemToArray(list, e);
    }
  }
  if (ok) {
    cJSON_AddItemToObject(root, "entries", list);
    list = NULL;
  }
  cJSON_Delete(cpu);
  cJSON_Delete(list);
  cJSON_Delete(workload);
  if (!ok) {
    cJSON_Delete(root);
    return NULL;
  }
  return root;
}

uattn_status uattn_tuning_write(const char *path, const uattn_tuning_entry *entries, int32_t num_entries,
                                const char *workload_json, const char *date) {
  uattn_clear_error();
  UATTN_CHECK_PTR(path, "path");
  if (!*path) return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "path is empty");
  if (num_entries < 0) return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "num_entries %d must be >= 0", num_entries);
  if (num_entries > 0) UATTN_CHECK_PTR(entries, "entries");
  char why[400];
  uattn_status st = check_entries(entries, num_entries, why, sizeof why);
  if (st != UATTN_OK) return uattn_fail(st, "tuning file \"%s\" not written: %s", path, why);
  cJSON *workload = cJSON_Parse(workload_json ? workload_json : "{}");
  if (!workload)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "tuning file \"%s\" not written: workload_json is not JSON", path);

  uattn_tuning_host host;
  uattn_tuning_host_get(&host);
  char now[32];
  if (!date) {
    const time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(now, sizeof now, "%Y-%m-%dT%H:%M:%SZ", &tm);
    date = now;
  }
  cJSON *root = file_json(&host, date, workload, entries, num_entries);
  char *text = root ? cJSON_Print(root) : NULL;
  cJSON_Delete(root);
  if (!text) return uattn_fail(UATTN_ERR_NO_MEMORY, "tuning file \"%s\" not written: out of memory", path);

  /* write beside it, then rename over it */
  const size_t tmp_len = strlen(path) + 32;
  char *tmp = malloc(tmp_len);
  if (!tmp) {
    cJSON_free(text);
    return uattn_fail(UATTN_ERR_NO_MEMORY, "tuning file \"%s\" not written: out of memory", path);
  }
  snprintf(tmp, tmp_len, "%s.tmp.%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "w");
  int err = f ? 0 : errno;
  if (f) {
    const size_t len = strlen(text);
    if (fwrite(text, 1, len, f) != len || fputc('\n', f) == EOF) err = errno ? errno : EIO;
    if (fclose(f) != 0 && !err) err = errno;
    if (!err && rename(tmp, path) != 0) err = errno;
    if (err) remove(tmp);
  }
  cJSON_free(text);
  free(tmp);
  if (err) return uattn_fail(UATTN_ERR_INVALID_ARGUMENT, "tuning file \"%s\" not written: %s", path, strerror(err));
  return UATTN_OK;
}
