/* The strict JSON reader (json.h). */
#include "common/json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "convert.h"

uattn_status uattn_json_refuse(uattn_json_reader *r, uattn_status st, const char *fmt, ...) {
  if (r->status != UATTN_OK) return st; /* the first reason is the one to fix */
  r->status = st;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->why, r->cap, fmt, ap);
  va_end(ap);
  return st;
}

const char *uattn_json_kind(const cJSON *x) {
  if (cJSON_IsNumber(x)) return "a number";
  if (cJSON_IsString(x)) return "a string";
  if (cJSON_IsBool(x)) return "a boolean";
  if (cJSON_IsNull(x)) return "null";
  if (cJSON_IsArray(x)) return "an array";
  if (cJSON_IsObject(x)) return "an object";
  return "nothing";
}

static bool tool(const uattn_json_reader *r) { return r->phrasing == UATTN_JSON_TOOL; }

/* ---- files ---------------------------------------------------------------------------------------------- */

/* A refusal about the file itself: uattn-run's lines start with its path, the library's callers name it. */
static cJSON *refuse_file(uattn_json_reader *r, uattn_status st, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static cJSON *refuse_file(uattn_json_reader *r, uattn_status st, const char *path, const char *fmt, ...) {
  char what[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  if (tool(r))
    uattn_json_refuse(r, st, "%s: %s", path, what);
  else
    uattn_json_refuse(r, st, "%s", what);
  return NULL;
}

/* The whole file as a NUL-terminated string (malloc), its length in *len; NULL refused. */
static char *read_text(uattn_json_reader *r, const char *path, size_t max_bytes, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    refuse_file(r, UATTN_ERR_INVALID_ARGUMENT, path, "cannot open it: %s", strerror(errno));
    return NULL;
  }
  struct stat sb;
  const bool regular = !max_bytes || (fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode));
  if (!regular || (max_bytes && (size_t)sb.st_size > max_bytes)) {
    if (!regular)
      refuse_file(r, UATTN_ERR_INVALID_ARGUMENT, path, "it is not a regular file");
    else
      refuse_file(r, UATTN_ERR_TOO_LARGE, path, "%lld bytes, over the limit of %zu", (long long)sb.st_size, max_bytes);
    fclose(f);
    return NULL;
  }
  char *text = NULL;
  size_t cap = 0, n = 0;
  for (;;) {
    if (n + 4096 + 1 > cap) {
      cap = cap ? cap * 2 : 65536;
      char *grown = realloc(text, cap);
      if (!grown) {
        free(text);
        fclose(f);
        refuse_file(r, UATTN_ERR_NO_MEMORY, path, "out of memory reading it");
        return NULL;
      }
      text = grown;
    }
    const size_t got = fread(text + n, 1, cap - n - 1, f);
    n += got;
    if (got == 0) break;
  }
  const int err = ferror(f) ? (errno ? errno : EIO) : 0;
  fclose(f);
  if (err) {
    free(text);
    refuse_file(r, UATTN_ERR_INVALID_ARGUMENT, path, "cannot read it: %s", strerror(err));
    return NULL;
  }
  text[n] = '\0';
  *len = n;
  return text;
}

cJSON *uattn_json_read_object(uattn_json_reader *r, const char *path, size_t max_bytes) {
  size_t len = 0;
  char *text = read_text(r, path, max_bytes, &len);
  if (!text) return NULL;
  const size_t nul = strlen(text);
  if (nul != len) {
    free(text);
    return refuse_file(r, UATTN_ERR_INVALID_ARGUMENT, path, "not JSON: a NUL byte at offset %zu", nul);
  }
  const char *end = NULL;
  /* the length counts the terminating NUL: that is how cJSON tells the end from trailing garbage */
  cJSON *root = cJSON_ParseWithLengthOpts(text, len + 1, &end, true);
  if (!root) {
    /* the line and column, which is what an editor needs */
    const char *at = end ? end : cJSON_GetErrorPtr();
    int line = 1, col = 1;
    if (at && at >= text && at <= text + len)
      for (const char *p = text; p < at; p++) {
        if (*p == '\n')
          line++, col = 1;
        else
          col++;
      }
    free(text);
    return refuse_file(r, UATTN_ERR_INVALID_ARGUMENT, path, "malformed JSON at line %d, column %d", line, col);
  }
  free(text);
  if (!cJSON_IsObject(root)) {
    refuse_file(r, UATTN_ERR_INVALID_ARGUMENT, path, "the top level must be a JSON object, not %s",
                uattn_json_kind(root));
    cJSON_Delete(root);
    return NULL;
  }
  return root;
}

/* ---- members ------------------------------------------------------------------------------------------ */

uattn_status uattn_json_check_keys(uattn_json_reader *r, const cJSON *obj, const char *where, const char *const *known,
                                   int n) {
  for (const cJSON *a = obj->child; a; a = a->next) {
    /* cJSON would quietly take the first of two */
    for (const cJSON *b = obj->child; b != a; b = b->next)
      if (!strcmp(a->string, b->string))
        return tool(r) ? uattn_json_refuse(r, UATTN_ERR_INVALID_ARGUMENT, "%s%s: key appears twice", where, a->string)
                       : uattn_json_refuse(r, UATTN_ERR_INVALID_ARGUMENT, "%s%s appears twice", where, a->string);
    int i = 0;
    while (i < n && strcmp(a->string, known[i])) i++;
    if (i < n) continue;
    if (!r->unknown_key)
      return uattn_json_refuse(r, UATTN_ERR_INVALID_ARGUMENT, "unknown key %s%s (a typo?)", where, a->string);
    char path[256];
    snprintf(path, sizeof path, "%s%s", where, a->string);
    r->unknown_key(path);
  }
  return UATTN_OK;
}

static uattn_status refuse_missing(uattn_json_reader *r, const char *where, const char *key) {
  return tool(r) ? uattn_json_refuse(r, UATTN_ERR_INVALID_ARGUMENT, "%s%s: missing required key", where, key)
                 : uattn_json_refuse(r, UATTN_ERR_INVALID_ARGUMENT, "%s%s is missing", where, key);
}

/* x is not what: an integer, a string (NHD, HND), ... */
static uattn_status refuse_kind(uattn_json_reader *r, const char *path, const char *what, const cJSON *x) {
  return tool(r) ? uattn_json_refuse(r, UATTN_ERR_INVALID_ARGUMENT, "%s: must be %s, got %s", path, what,
                                     uattn_json_kind(x))
                 : uattn_json_refuse(r, UATTN_ERR_INVALID_ARGUMENT, "%s must be %s, not %s", path, what,
                                     uattn_json_kind(x));
}

const cJSON *uattn_json_required(uattn_json_reader *r, const cJSON *obj, const char *where, const char *key) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!x) refuse_missing(r, where, key);
  return x;
}

uattn_status uattn_json_expect(uattn_json_reader *r, const cJSON *x, const char *path, bool is_array,
                               const char *what) {
  if (is_array ? cJSON_IsArray(x) : cJSON_IsObject(x)) return UATTN_OK;
  return refuse_kind(r, path, what, x);
}

uattn_status uattn_json_int_value(uattn_json_reader *r, const cJSON *x, const char *path, int64_t lo, int64_t hi,
                                  int32_t *out) {
  if (!cJSON_IsNumber(x)) return refuse_kind(r, path, "an integer", x);
  const double v = x->valuedouble;
  if (!isfinite(v) || v != floor(v))
    return tool(r) ? uattn_json_refuse(r, UATTN_ERR_INVALID_ARGUMENT, "%s: must be an integer, got %g", path, v)
                   : uattn_json_refuse(r, UATTN_ERR_INVALID_ARGUMENT, "%s = %g is not an integer", path, v);
  if (v < (double)lo || v > (double)hi) {
    if (!tool(r))
      return uattn_json_refuse(r, UATTN_ERR_OUT_OF_RANGE, "%s = %.0f is out of range [%lld, %lld]", path, v,
                               (long long)lo, (long long)hi);
    if (v < (double)lo)
      return uattn_json_refuse(r, UATTN_ERR_OUT_OF_RANGE, "%s: %.0f must be >= %lld", path, v, (long long)lo);
    return uattn_json_refuse(r, UATTN_ERR_OUT_OF_RANGE, "%s: %.0f is over %lld", path, v, (long long)hi);
  }
  *out = (int32_t)v;
  return UATTN_OK;
}

uattn_status uattn_json_int(uattn_json_reader *r, const cJSON *obj, const char *where, const char *key, bool required,
                            int32_t def, int64_t lo, int64_t hi, int32_t *out) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!x) {
    if (required) return refuse_missing(r, where, key);
    *out = def;
    return UATTN_OK;
  }
  char path[256];
  snprintf(path, sizeof path, "%s%s", where, key);
  return uattn_json_int_value(r, x, path, lo, hi, out);
}

uattn_status uattn_json_number(uattn_json_reader *r, const cJSON *obj, const char *where, const char *key, double lo,
                               double hi, double *out) {
  const cJSON *x = uattn_json_required(r, obj, where, key);
  if (!x) return r->status;
  char path[256];
  snprintf(path, sizeof path, "%s%s", where, key);
  const bool number = cJSON_IsNumber(x),
             usable = number && isfinite(x->valuedouble) && x->valuedouble >= lo && x->valuedouble <= hi;
  if (usable) {
    *out = x->valuedouble;
    return UATTN_OK;
  }
  /* the library's files keep times only, so its one line covers both */
  if (!tool(r)) return uattn_json_refuse(r, UATTN_ERR_OUT_OF_RANGE, "%s must be a number >= %g", path, lo);
  if (!number) return refuse_kind(r, path, "a number", x);
  return uattn_json_refuse(r, UATTN_ERR_OUT_OF_RANGE, "%s: %g is not a usable value (finite, >= %g)", path,
                           x->valuedouble, lo);
}

/* The string member key of obj; what names the strings taken, for messages. */
static uattn_status get_string(uattn_json_reader *r, const cJSON *obj, const char *where, const char *key,
                               const char *what, const char **out) {
  const cJSON *x = uattn_json_required(r, obj, where, key);
  if (!x) return r->status;
  if (!cJSON_IsString(x)) {
    char path[256];
    snprintf(path, sizeof path, "%s%s", where, key);
    return refuse_kind(r, path, what, x);
  }
  *out = x->valuestring;
  return UATTN_OK;
}

uattn_status uattn_json_string(uattn_json_reader *r, const cJSON *obj, const char *where, const char *key,
                               const char **out) {
  return get_string(r, obj, where, key, "a string", out);
}

static uattn_status refuse_choice(uattn_json_reader *r, const char *where, const char *key, const char *s,
                                  const char *allowed) {
  return tool(r) ? uattn_json_refuse(r, UATTN_ERR_OUT_OF_RANGE, "%s%s: \"%s\" is not one of %s", where, key, s, allowed)
                 : uattn_json_refuse(r, UATTN_ERR_OUT_OF_RANGE, "%s%s \"%s\" is not one of %s", where, key, s, allowed);
}

uattn_status uattn_json_choice(uattn_json_reader *r, const cJSON *obj, const char *where, const char *key,
                               const char *const *names, const int *values, int n, const char *allowed, int *out) {
  char what[128];
  snprintf(what, sizeof what, "a string (%s)", allowed);
  const char *s = NULL;
  if (get_string(r, obj, where, key, what, &s) != UATTN_OK) return r->status;
  for (int i = 0; i < n; i++)
    if (!strcmp(s, names[i])) {
      *out = values[i];
      return UATTN_OK;
    }
  return refuse_choice(r, where, key, s, allowed);
}

uattn_status uattn_json_dtype(uattn_json_reader *r, const cJSON *obj, const char *where, const char *key,
                              bool long_names, bool of_cache, uattn_dtype *out) {
  const char *allowed = of_cache ? "f32, bf16, f16, fp8_e4m3, fp8_e5m2" : "f32, bf16, f16";
  char what[64];
  snprintf(what, sizeof what, "a string (%s)", allowed);
  const char *s = NULL;
  if (get_string(r, obj, where, key, what, &s) != UATTN_OK) return r->status;
  if (!uattn_dtype_parse(s, long_names, out)) return refuse_choice(r, where, key, s, allowed);
  if (of_cache || !uattn_dtype_is_fp8(*out)) return UATTN_OK;
  /* q, k, v and out are what an engine computes in; fp8 is a storage format for the caches only */
  return uattn_json_refuse(r, UATTN_ERR_INVALID_ARGUMENT,
                           tool(r) ? "%s%s: %s is a cache dtype only (q, k, v and out are f32, bf16 or f16)"
                                   : "%s%s = %s is a cache dtype only (q, k, v and out are f32, bf16 or f16)",
                           where, key, uattn_dtype_name(*out));
}

uattn_status uattn_json_int_list(uattn_json_reader *r, const cJSON *x, const char *path, int64_t lo, int64_t hi,
                                 int32_t **out, int32_t *count) {
  if (!cJSON_IsArray(x)) return refuse_kind(r, path, "an array of integers", x);
  const int n = cJSON_GetArraySize(x);
  int32_t *v = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
  if (!v)
    return tool(r) ? uattn_json_refuse(r, UATTN_ERR_NO_MEMORY, "%s: out of memory", path)
                   : uattn_json_refuse(r, UATTN_ERR_NO_MEMORY, "out of memory reading %s", path);
  int i = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, x) {
    char elem[288];
    snprintf(elem, sizeof elem, "%s[%d]", path, i);
    if (uattn_json_int_value(r, e, elem, lo, hi, &v[i]) != UATTN_OK) {
      free(v);
      return r->status;
    }
    i++;
  }
  *out = v;
  *count = n;
  return UATTN_OK;
}
