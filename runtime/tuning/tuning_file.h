/* The tuning file as a runtime's table holds it, for the two files of the tuning (runtime/tuning/): tuning_file.c
 * knows this machine's identity and reads, checks and writes the file; tuning.c keeps the table a runtime has
 * loaded, its lookups and the report. Only those two files include this header. */
#ifndef UATTN_RUNTIME_TUNING_FILE_H
#define UATTN_RUNTIME_TUNING_FILE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "common/internal.h"
#include "common/json.h"
#include "uattn_tuning.h"

#define TUNING_WORKLOAD_CHARS 240 /* of the workload, in the report */

typedef struct tuning_slot {
  uattn_tuning_entry entry;
  _Atomic int64_t uses;
} tuning_slot;

typedef struct tuning_table {
  struct tuning_table *next_retired;
  size_t bytes;
  int32_t num_entries;
  tuning_slot *slots; /* [num_entries], right after the table in the same allocation */
  uattn_tuning_host host;
  char file[512];
  char date[64];
  char workload[TUNING_WORKLOAD_CHARS + 4];
} tuning_table;

/* Parses and checks the file at path into a new table allocated from alloc, *out. The reason of a refusal goes
 * to r. */
uattn_status uattn_tuning_parse_file(uattn_json_reader *r, uattn_alloc *alloc, const char *path, tuning_table **out);

/* Copies src into dst[cap], cut to fit. */
static inline void copy_text(char *dst, size_t cap, const char *src) {
  size_t n = strlen(src);
  if (n >= cap) n = cap - 1;
  memcpy(dst, src, n);
  dst[n] = '\0';
}

static inline bool same_bucket(const uattn_tuning_entry *e, int32_t block_size, int32_t head_dim, uattn_dtype dtype) {
  return e->block_size == block_size && e->head_dim == head_dim && e->cache_dtype == dtype;
}

#endif /* UATTN_RUNTIME_TUNING_FILE_H */
