/* Tuning files: the tunables that ran a workload fastest on one machine, per kernel bucket (uattn.h has the core). */
#ifndef UATTN_TUNING_H
#define UATTN_TUNING_H

#include "uattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------------ */
/* Tuning files                                                                                     */
/* ------------------------------------------------------------------------------------------------ */

/*
 * A tuning file says, per kernel bucket (block_size, head_dim, cache dtype), which values of the tunables
 * ran a workload fastest on one machine; perf/uattn-sweep measures them and writes it. The thread count
 * changes the speed only, never the results (bitwise). The query tile, the chunk size and split-K regroup
 * the fp32 sums (causal slices, shared chunks, key ranges merged), so they change results within the
 * tolerances the tests state, not bit for bit. A runtime takes one
 *  - at creation, from the file named by the environment variable UATTN_TUNING_FILE (unset or "" = none);
 *  - from uattn_runtime_load_tuning(rt, path) at any time.
 * What is applied: a layer field or plan-config field left at 0 (the library default) takes the tuned
 * value of its bucket; a value the engine set itself always wins. The forward applies query_tile,
 * chunk_size and num_threads to each call; split_min_keys and split_keys belong to the plan, created
 * before any layer, so an engine takes them with uattn_runtime_tuned_plan_config (and may take the layer
 * fields itself with uattn_runtime_tuned_layer). A bucket with no entry runs on the defaults.
 *
 * The file, JSON (format_version UATTN_TUNING_FORMAT_VERSION):
 *   {"format": "uattn-tuning", "format_version": 1, "uattn_version": "0.1.0",
 *    "cpu": {"vendor": "AuthenticAMD", "model": "AMD EPYC 7B13", "kernel_set": "avx2"},
 *    "date": "2025-06-01T12:00:00Z",
 *    "workload": {"trace": "generated", "steps": 16, ...},          <- any JSON: what it was tuned on
 *    "entries": [{"block_size": 16, "head_dim": 128, "cache_dtype": "bf16",
 *                 "chunk_size": 0, "query_tile": 256, "split_min_keys": 2048, "split_keys": 1024,
 *                 "num_threads": 2, "tuned_ms": 41.2, "default_ms": 45.0}]}
 * In an entry the bucket keys are required and the rest optional (0 when absent); cache_dtype is "f32",
 * "bf16" or "f16". "date" and "workload" are optional.
 *
 * A file is refused, with a status and a message naming the file and the reason, and the runtime keeps
 * what it had (the library defaults unless a file was loaded before), when
 *  - it cannot be read, or is over 16 MiB                        UATTN_ERR_INVALID_ARGUMENT / _TOO_LARGE
 *  - it is not JSON, lacks a key, has a key of the wrong type or an unknown key (a typo must not
 *    silently do nothing), or has two entries for one bucket     UATTN_ERR_INVALID_ARGUMENT
 *  - "format" is not "uattn-tuning" or format_version is another UATTN_ERR_UNSUPPORTED
 *  - it is stale: made by another uattn version, on another CPU (vendor or model name differ), or for
 *    another kernel set than uattn_kernel_set() picks now (UATTN_ISA may force one)
 *                                                                UATTN_ERR_INCONSISTENT
 *  - a value is out of range (see uattn_tuning_entry)           UATTN_ERR_OUT_OF_RANGE
 *
 * UATTN_TUNING_FILE and a refused file: uattn_runtime_create still succeeds, on the defaults, and leaves
 * uattn_last_error() empty; uattn_runtime_tuning_info (last_status, message) and the report say why the
 * file was refused. This differs on purpose from UATTN_NUM_THREADS, whose error fails creation: a tuning
 * file changes speed only, and one made stale by a CPU, kernel-set or library upgrade must not stop an
 * engine from starting. An engine that wants to fail instead checks uattn_runtime_tuning_info after
 * creation, or calls uattn_runtime_load_tuning itself and checks its status.
 */
#define UATTN_TUNING_FORMAT_VERSION 1
/* The uattn version as one number (MAJOR * 10000 + MINOR * 100 + PATCH) for compile-time checks; the
 * library actually linked is uattn_version(). A tuning file must name that exact version. */
#define UATTN_VERSION_NUMBER (UATTN_VERSION_MAJOR * 10000 + UATTN_VERSION_MINOR * 100 + UATTN_VERSION_PATCH)

/* Largest values a tuning entry may hold. */
#define UATTN_TUNING_MAX_BLOCK_SIZE 65536
#define UATTN_TUNING_MAX_HEAD_DIM 4096
#define UATTN_TUNING_MAX_TILE (1 << 20) /* chunk_size, query_tile */

/* One kernel bucket and its tuned values. 0 in a tunable means the library's default. */
typedef struct uattn_tuning_entry {
  int32_t block_size;      /* the bucket: tokens per KV block, 1..UATTN_TUNING_MAX_BLOCK_SIZE */
  int32_t head_dim;        /* 1..UATTN_TUNING_MAX_HEAD_DIM */
  uattn_dtype cache_dtype; /* of the KV caches */
  int32_t chunk_size;      /* uattn_layer.chunk_size: shared blocks per online-merge chunk, 0 = whole */
  int32_t query_tile;      /* uattn_layer.causal_width: query rows per tile, 0 = its default */
  int32_t split_min_keys;  /* uattn_plan_config.split_min_keys, >= 0 (0 = 8192) */
  int32_t split_keys;      /* uattn_plan_config.split_keys, >= 0 (0 = 4096) */
  int32_t num_threads;     /* workers a call of this bucket runs on, 0..UATTN_RUNTIME_MAX_THREADS, 0 = all */
  /* What the sweep measured, for the reader (not used by the library): the workload's time in ms with
   * these values and with the defaults; >= 0, 0 = not measured. */
  double tuned_ms;
  double default_ms;
} uattn_tuning_entry;

/* What a tuning file records about the machine it was made on; uattn_tuning_host_get gives this one's. */
typedef struct uattn_tuning_host {
  char cpu_vendor[32];    /* CPUID's vendor ("AuthenticAMD", "GenuineIntel"), else /proc/cpuinfo's */
  char cpu_model[128];    /* CPUID's brand string, else /proc/cpuinfo's "model name"; spaces trimmed */
  char kernel_set[32];    /* uattn_kernel_set(): what uattn_forward runs here now */
  char uattn_version[16]; /* uattn_version() */
} uattn_tuning_host;

UATTN_API uattn_status uattn_tuning_host_get(uattn_tuning_host *out);

/* Writes a tuning file for this machine (uattn_tuning_host_get) with num_entries entries (>= 0, each
 * valid as the loader checks, no bucket twice). workload_json: JSON text describing the workload, stored
 * as parsed (NULL = {}); date: any text, NULL = now in UTC ("YYYY-MM-DDTHH:MM:SSZ"). The file is written
 * next to path and renamed over it, so a reader never sees half a file. */
UATTN_API uattn_status uattn_tuning_write(const char *path, const uattn_tuning_entry *entries, int32_t num_entries,
                                          const char *workload_json, const char *date);

/* Loads a tuning file into rt, replacing the one it had (see above for what is refused: then rt keeps
 * what it had). path NULL drops the tuning: back to the defaults. Safe while other threads run forward
 * calls on rt: each call sees the old tuning or the new one, never a mix. */
UATTN_API uattn_status uattn_runtime_load_tuning(uattn_runtime *rt, const char *path);

/* Where a runtime's tuning stands. */
typedef struct uattn_tuning_info {
  bool loaded;              /* a file's entries are in use */
  bool from_env;            /* the last load was the one from UATTN_TUNING_FILE at creation */
  int32_t num_entries;      /* of the file in use */
  char file[512];           /* the file in use ("" = the defaults), truncated if longer */
  uattn_status last_status; /* of the last load tried (UATTN_OK if none, or if it succeeded) */
  char message[512];        /* why it was refused ("" if it was not) */
} uattn_tuning_info;

UATTN_API uattn_status uattn_runtime_tuning_info(const uattn_runtime *rt, uattn_tuning_info *out);

/* A text report for people: the file in use (its CPU, date and workload) or why the last one was refused,
 * every entry with how many forward calls it served, and the buckets that ran on the defaults for want of
 * an entry. Writes at most cap bytes to buf, NUL included, and the report's length (without the NUL) to
 * *length; buf NULL and cap 0 give the length only. A cap too small is UATTN_ERR_CAPACITY, nothing written. */
UATTN_API uattn_status uattn_runtime_tuning_report(const uattn_runtime *rt, char *buf, size_t cap, size_t *length);

/* The entry rt holds for a bucket: *found (optional) says whether there is one; without one, *out is the
 * bucket with every tunable 0 (the defaults). Does not count as a use. */
UATTN_API uattn_status uattn_runtime_tuning_lookup(const uattn_runtime *rt, int32_t block_size, int32_t head_dim,
                                                   uattn_dtype cache_dtype, uattn_tuning_entry *out, bool *found);

/* Fills the split-K fields of a plan config from the bucket (config->block_size, head_dim, cache_dtype):
 * split_min_keys and split_keys are each replaced when they are 0 or still hold the values of
 * uattn_plan_config_default (8192 and 4096) and the entry's is not 0; any other value, and every other
 * field, is left alone. Call it between uattn_plan_config_default and uattn_plan_create. No entry: the
 * config is unchanged (still UATTN_OK). */
UATTN_API uattn_status uattn_runtime_tuned_plan_config(const uattn_runtime *rt, int32_t head_dim,
                                                       uattn_dtype cache_dtype, uattn_plan_config *config);

/* Fills causal_width and chunk_size of a layer that left them at 0 from the bucket (block_size,
 * layer->head_dim, layer->cache_dtype). The forward does the same by itself; this is for an engine that
 * wants to see or keep the values. No entry: the layer is unchanged (still UATTN_OK). */
UATTN_API uattn_status uattn_runtime_tuned_layer(const uattn_runtime *rt, int32_t block_size, uattn_layer *layer);

#ifdef __cplusplus
}
#endif

#endif
