/* What the step runners (uattn-run, uattn-run-cp) share around the step they read (support/step.h): their
 * common options, the one error line a failure records, the whole step planned as uattn-run plans it, the
 * runtime and the forward's tensors. */
#ifndef UATTN_PERF_RUNNER_H
#define UATTN_PERF_RUNNER_H

#include <stdint.h>

#include "support/step.h"
#include "uattn.h"

/* The first failure's line; callers return -1 and unwind, and the tool prints it once. */
extern char runner_error[2048];

int runner_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "call: the library's message (UATTN_ERR_...)". */
int runner_fail_lib(const char *call, uattn_status st);

typedef struct runner_options {
  const char *json_path, *out_dir; /* STEP.json, --out DIR */
  int32_t repeat;                  /* --repeat N, 0 when absent */
} runner_options;

/* A tool's own options: 1 when argv[*i] is none of them, 0 when taken (*i past its value), -1 with the line. */
typedef int (*runner_own_option)(void *tool, int argc, char **argv, int *i);

/* STEP.json, --out DIR, --repeat N and the tool's own options (own, or NULL). 0; 1 for -h or --help; or -1
 * with the line, `hint` appended to those of an unknown option and a missing STEP.json. */
int runner_parse_args(int argc, char **argv, runner_options *o, runner_own_option own, void *tool, const char *hint);

/* v, the value of option `name`, as a count in [1, max] into *out: 0, or -1 with the line. */
int runner_parse_count(const char *name, const char *v, int max, int32_t *out);

/* Plans the whole step as uattn-run does (limits from the step, no bucketing) into *plan and its info: 0, or
 * -1 with the line. `tool` names the runner in the line of a disagreement that would be its own bug. */
int runner_plan_step(const step *s, const char *tool, uattn_plan **plan, uattn_plan_info *info);

/* A runtime of `threads` workers (0: the library's default): 0, or -1 with the line. */
int runner_runtime(int32_t threads, uattn_runtime **rt);

/* Workers the runtime really has. */
int32_t runner_workers(const uattn_runtime *rt);

/* The forward's tensors: the step's q, k and v against the given caches of num_blocks blocks and outputs (a
 * kv_latent step: no v, and value_cache NULL). */
uattn_tensors runner_tensors(const step *s, void *key_cache, void *value_cache, int32_t num_blocks, void *out,
                             float *lse);

#endif
