#include "run/runner.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/args.h"

char runner_error[2048];

int runner_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(runner_error, sizeof runner_error, fmt, ap);
  va_end(ap);
  return -1;
}

int runner_fail_lib(const char *call, uattn_status st) {
  return runner_fail("%s: %s (%s)", call, uattn_last_error(), uattn_status_name(st));
}

int runner_parse_count(const char *name, const char *v, int max, int32_t *out) {
  int n;
  if (perf_parse_int(v, 1, max, &n)) return runner_fail("%s: '%s' is not a count in [1, %d]", name, v, max);
  *out = n;
  return 0;
}

int runner_parse_args(int argc, char **argv, runner_options *o, runner_own_option own, void *tool, const char *hint) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int mine = 1;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) return 1;
    if (perf_is_option(a, "--out")) {
      if (!*(o->out_dir = perf_option_value("--out", argc, argv, &i))) return runner_fail("--out needs a directory");
    } else if (perf_is_option(a, "--repeat")) {
      if (runner_parse_count("--repeat", perf_option_value("--repeat", argc, argv, &i), 1000000, &o->repeat)) return -1;
    } else if (own && (mine = own(tool, argc, argv, &i)) <= 0) {
      if (mine < 0) return -1;
    } else if (a[0] == '-' && a[1]) {
      return runner_fail("unknown option %s%s", a, hint);
    } else if (o->json_path) {
      return runner_fail("one STEP.json only (also got %s)", a);
    } else {
      o->json_path = a;
    }
  }
  if (!o->json_path) return runner_fail("missing STEP.json%s", hint);
  if (!o->out_dir) return runner_fail("missing --out DIR");
  return 0;
}

int runner_plan_step(const step *s, const char *tool, uattn_plan **plan, uattn_plan_info *info) {
  const uattn_plan_config pc = step_plan_config(s);
  uattn_status st = uattn_plan_create(&pc, plan);
  if (st) return runner_fail_lib("uattn_plan_create", st);
  const uattn_step batch = step_batch(s);
  if ((st = uattn_plan_step(*plan, &batch))) return runner_fail_lib("uattn_plan_step", st);
  uattn_plan_get_info(*plan, info);
  if (info->num_tokens != s->num_tokens) /* the shapes were checked against our reading of the draft rule */
    return runner_fail("requests: the planner schedules %d tokens, the runner expected %d (%s bug)", info->num_tokens,
                       s->num_tokens, tool);
  return 0;
}

int runner_runtime(int32_t threads, uattn_runtime **rt) {
  uattn_runtime_config c = uattn_runtime_config_default();
  c.num_threads = threads;
  const uattn_status st = uattn_runtime_create(&c, rt);
  return st ? runner_fail_lib("uattn_runtime_create", st) : 0;
}

int32_t runner_workers(const uattn_runtime *rt) {
  uattn_topology topo;
  return uattn_runtime_get_topology(rt, &topo) == UATTN_OK ? topo.num_workers : 0;
}

uattn_tensors runner_tensors(const step *s, void *key_cache, void *value_cache, int32_t num_blocks, void *out,
                             float *lse) {
  uattn_tensors t;
  memset(&t, 0, sizeof t);
  t.q = s->t[STEP_Q].a.data;
  t.k = s->t[STEP_K].a.data;
  t.v = s->kv_latent ? NULL : s->t[STEP_V].a.data;
  t.key_cache = key_cache;
  t.value_cache = value_cache;
  t.num_blocks = num_blocks;
  t.block_size = s->block_size;
  t.out = out;
  t.lse = lse;
  return t;
}
