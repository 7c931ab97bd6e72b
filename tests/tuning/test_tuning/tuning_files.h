/* Tuning files (runtime/tuning/): the writer and the loader round trip, lookups and what they fill in,
 * use counts (also from several threads while files are reloaded), the report, every refusal (missing,
 * malformed, another format version, stale: another uattn version, CPU or kernel set, out-of-range values,
 * unknown or repeated keys, a bucket twice) each with its status and message and the defaults or the
 * previous file kept, the UATTN_TUNING_FILE path at runtime creation, bad arguments, and mangled files that
 * must never crash the loader. No timings are asserted.
 *
 * This header holds what the suite's files share (tuning_files.c): the test's directory, runtimes, entries, files
 * written there, and assertions on a runtime's tuning. */
#ifndef UATTN_TEST_TUNING_FILES_H
#define UATTN_TEST_TUNING_FILES_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "uattn.h"
#include "uattn_tuning.h"

#define CHECK_OK(call)                                                                                                 \
  do {                                                                                                                 \
    uattn_status st_ = (call);                                                                                         \
    cr_assert_eq(st_, UATTN_OK, "%s returned %s: %s", #call, uattn_status_name(st_), uattn_last_error());              \
  } while (0)

/* the test's directory, made by the suite's init */
extern char dir[64];
/* name in the test's directory, in one of four static buffers */
const char *path_of(const char *name);
/* a one-thread runtime */
uattn_runtime *runtime(void);
uattn_tuning_entry entry(int32_t bs, int32_t hd, uattn_dtype dt, int32_t chunk, int32_t tile, int32_t smin,
                         int32_t skeys, int32_t threads);
extern const uattn_tuning_entry two[2];
void write_two(const char *path);
/* the runtime's tuning report, in a buffer to free */
char *report(const uattn_runtime *rt);
void assert_contains(const char *text, const char *part);
void assert_defaults(const uattn_runtime *rt);

/* ---- a hand-written file: this machine's, then changed by a test ------------------------------------- */

cJSON *valid_doc(void);
/* writes root (and frees it) to name in the test's directory; returns its path */
const char *write_doc(cJSON *root, const char *name);
const char *write_text(const char *text, size_t len, const char *name);
cJSON *first_entry(cJSON *root);
/* Loading path into a fresh runtime is refused with status st and a message naming the file and
 * containing reason; the runtime keeps the defaults and the report says why. */
void assert_refused(const char *path, uattn_status st, const char *reason);

#endif
