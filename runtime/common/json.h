/* The strict JSON reader over cJSON that every JSON file of uattn is read with: tuning files
 * (tuning/tuning.c), uattn-run's STEP.json (support/step.c), uattn-sweep's trace files (perf/sweep/workload.c).
 * A file is one JSON object, nothing after it, no NUL byte; keys appear once and unknown keys are refused
 * (or reported and skipped); every refusal names the key's path ("entries[3].head_dim") and keeps the
 * first reason. Internal: the perf programs link uattn_static and include "common/json.h". */
#ifndef UATTN_JSON_H
#define UATTN_JSON_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "uattn.h"

/* Two phrasings, because both are documented and tested as they are: the library's ("head_dim is missing",
 * "head_dim = 0 is out of range [1, 4096]", "must be an integer, not a string"), which tuning files and
 * trace files use, and uattn-run's, one "key: what" line ("head_dim: missing required key", "head_dim: 0
 * must be >= 1", "must be an integer, got a string"), whose file errors also name the file. */
typedef enum uattn_json_phrasing {
  UATTN_JSON_LIBRARY,
  UATTN_JSON_TOOL,
} uattn_json_phrasing;

typedef struct uattn_json_reader {
  uattn_json_phrasing phrasing;
  char *why; /* the first refusal's reason, why[cap] */
  size_t cap;
  uattn_status status; /* its status: UATTN_ERR_INVALID_ARGUMENT, UATTN_ERR_OUT_OF_RANGE for a value out of
                          range, ...; UATTN_OK until a refusal */
  /* unknown keys: refused when NULL; else passed here (path as "requests[0].key") and skipped */
  void (*unknown_key)(const char *path);
} uattn_json_reader;

/* Records st and the reason (unless one is kept already) and returns st, so a check reads
 * `return uattn_json_refuse(r, UATTN_ERR_..., "...", ...);`. */
uattn_status uattn_json_refuse(uattn_json_reader *r, uattn_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* "a number", "a string", "an array", ...; "nothing" for NULL: what a value is, for messages. */
const char *uattn_json_kind(const cJSON *x);

/* The file at path as a JSON object (cJSON_Delete it), or NULL with the reason. max_bytes: 0 for no limit;
 * with a limit, only a regular file is read (its size is checked before reading). */
cJSON *uattn_json_read_object(uattn_json_reader *r, const char *path, size_t max_bytes);

/* Refuses a key of obj that appears twice or is not one of known[n]. where: the path of obj with a trailing
 * dot ("", "cpu.", "entries[3]."). */
uattn_status uattn_json_check_keys(uattn_json_reader *r, const cJSON *obj, const char *where, const char *const *known,
                                   int n);

/* The member key of obj; NULL (refused) when it is missing. */
const cJSON *uattn_json_required(uattn_json_reader *r, const cJSON *obj, const char *where, const char *key);

/* x, refused unless cJSON_IsObject (is_array false) or cJSON_IsArray (true). what: "an object of file names". */
uattn_status uattn_json_expect(uattn_json_reader *r, const cJSON *x, const char *path, bool is_array, const char *what);

/* An integer in [lo, hi]. x: the value at path. */
uattn_status uattn_json_int_value(uattn_json_reader *r, const cJSON *x, const char *path, int64_t lo, int64_t hi,
                                  int32_t *out);
/* The member key of obj as an integer in [lo, hi]; absent: *out = def, or refused when required. */
uattn_status uattn_json_int(uattn_json_reader *r, const cJSON *obj, const char *where, const char *key, bool required,
                            int32_t def, int64_t lo, int64_t hi, int32_t *out);
/* A finite number in [lo, hi], required. */
uattn_status uattn_json_number(uattn_json_reader *r, const cJSON *obj, const char *where, const char *key, double lo,
                               double hi, double *out);
/* A string, required. */
uattn_status uattn_json_string(uattn_json_reader *r, const cJSON *obj, const char *where, const char *key,
                               const char **out);
/* A dtype's name (convert.h's table: short names, long ones too when long_names), required. The fp8 formats
 * only where of_cache (a cache's dtype): q, k, v and out are f32, bf16 or f16. */
uattn_status uattn_json_dtype(uattn_json_reader *r, const cJSON *obj, const char *where, const char *key,
                              bool long_names, bool of_cache, uattn_dtype *out);
/* One of names[n], giving values[i]; allowed lists them for messages ("NHD, HND"). Required. */
uattn_status uattn_json_choice(uattn_json_reader *r, const cJSON *obj, const char *where, const char *key,
                               const char *const *names, const int *values, int n, const char *allowed, int *out);
/* x as an array of integers in [lo, hi], in a fresh malloc'ed array (never NULL on success, even empty). */
uattn_status uattn_json_int_list(uattn_json_reader *r, const cJSON *x, const char *path, int64_t lo, int64_t hi,
                                 int32_t **out, int32_t *count);

#endif
