/* uattn-plan-bench: planning one large serving step (256 requests, 8192 tokens, a shared system prompt),
 * against the numpy re-statement of the seed on the very same batch, run alongside. Reports medians and
 * the ratio, and the allocations made by the timed steps (there should be none). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/timing.h"
#include "common/trace.h"
#include "uattn.h"

#ifndef UATTN_SOURCE_DIR
#define UATTN_SOURCE_DIR "."
#endif

typedef struct options {
  int repeat, seed_repeat, json;
  const char *python, *reference;
} options;

typedef struct counting {
  uattn_allocator hooks;
  long allocs;
} counting;

static void *count_alloc(void *user, size_t bytes) {
  ((counting *)user)->allocs++;
  void *p = NULL;
  return posix_memalign(&p, 64, bytes ? bytes : 64) == 0 ? p : NULL;
}

static void count_free(void *user, void *p) {
  (void)user;
  free(p);
}

static void write_ints(FILE *f, const int32_t *x, int32_t n) {
  fputc('[', f);
  for (int32_t i = 0; i < n; i++) fprintf(f, i ? ",%d" : "%d", x[i]);
  fputc(']', f);
}

/* The batch in the reference script's schema: {"config": ..., "step": ...}. */
static int write_batch(const char *path, const uattn_plan_config *pc, const uattn_step *s) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fprintf(f,
          "{\"config\": {\"block_size\": %d, \"num_blocks\": %d, \"max_num_seqs\": %d, "
          "\"max_num_batched_tokens\": %d, \"max_model_len\": %d, \"chunk_size\": 0, \"bucketing\": \"none\"},\n",
          pc->block_size, pc->num_blocks, pc->max_num_seqs, pc->max_num_batched_tokens, pc->max_model_len);
  int32_t longest = 0;
  for (int32_t r = 0; r < s->num_reqs; r++) {
    int32_t len = s->num_computed[r] + s->num_scheduled[r];
    if (len > longest) longest = len;
  }
  const char *keys[] = {"num_computed", "num_scheduled", "num_prompt"};
  const int32_t *vals[] = {s->num_computed, s->num_scheduled, s->num_prompt};
  fprintf(f, "\"step\": {");
  for (int k = 0; k < 3; k++) {
    fprintf(f, "\"%s\": ", keys[k]);
    write_ints(f, vals[k], s->num_reqs);
    fprintf(f, ",\n");
  }
  fprintf(f, "\"block_table\": [");
  for (int32_t r = 0; r < s->num_reqs; r++) {
    if (r) fputc(',', f);
    write_ints(f, s->block_table + (size_t)r * s->block_table_stride, s->block_table_stride);
  }
  fprintf(f, "],\n\"token_ids\": [");
  for (int32_t r = 0; r < s->num_reqs; r++) {
    if (r) fputc(',', f);
    /* a row long enough for every position the step reads; ids past a request's length are don't-care */
    write_ints(f, s->token_ids + (size_t)r * s->token_ids_stride, longest);
  }
  fprintf(f, "],\n\"draft_tokens\": [");
  for (int32_t r = 0; r < s->num_reqs; r++) {
    if (r) fputc(',', f);
    write_ints(f, s->draft_tokens + s->draft_offsets[r], s->draft_offsets[r + 1] - s->draft_offsets[r]);
  }
  fprintf(f, "],\n\"async_scheduling\": false}}\n");
  return fclose(f);
}

/* Runs the reference on the batch; fills the two medians (ms) or returns -1. */
static int time_seed(const options *o, const char *batch, double *no_bias_ms, double *with_bias_ms) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "%s %s time --batch %s --repeat %d", o->python, o->reference, batch, o->seed_repeat);
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  char out[4096];
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  if (pclose(p) != 0) {
    fprintf(stderr, "uattn-plan-bench: the reference failed: %s\n%s\n", cmd, out);
    return -1;
  }
  cJSON *root = cJSON_Parse(out);
  const cJSON *a = cJSON_GetObjectItem(root, "median_ms_no_bias"),
              *b = cJSON_GetObjectItem(root, "median_ms_with_bias");
  int ok = cJSON_IsNumber(a) && cJSON_IsNumber(b);
  if (ok) {
    *no_bias_ms = a->valuedouble;
    *with_bias_ms = b->valuedouble;
  } else {
    fprintf(stderr, "uattn-plan-bench: unexpected output from the reference: %s\n", out);
  }
  cJSON_Delete(root);
  return ok ? 0 : -1;
}

static void usage(void) {
  fprintf(
      stderr,
      "usage: uattn-plan-bench [--repeat N] [--seed-repeat N] [--no-seed] [--json] [--python PATH] [--ref SCRIPT]\n");
}

int main(int argc, char **argv) {
  options o = {200, 10, 0, "/usr/bin/python3", UATTN_SOURCE_DIR "/tests/ref/seed_unified_batch.py"};
  int run_seed = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--repeat") && i + 1 < argc)
      o.repeat = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--seed-repeat") && i + 1 < argc)
      o.seed_repeat = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--no-seed"))
      run_seed = 0;
    else if (!strcmp(argv[i], "--json"))
      o.json = 1;
    else if (!strcmp(argv[i], "--python") && i + 1 < argc)
      o.python = argv[++i];
    else if (!strcmp(argv[i], "--ref") && i + 1 < argc)
      o.reference = argv[++i];
    else {
      usage();
      return 2;
    }
  }
  if (o.repeat < 1 || o.seed_repeat < 1) {
    usage();
    return 2;
  }

  /* a serving trace at 256 sequences and 8192 tokens a step; take its first full step that mixes decodes,
   * verification and prompt chunks */
  const int32_t bs = 16, seqs = 256, budget = 8192, max_len = 8192, num_blocks = 48000;
  trace_config tc = trace_config_default(bs, num_blocks, seqs, budget, max_len);
  tc.system_prompt_len = 2048;
  tc.prompt_max = 2048;
  tc.output_min = 8; /* short answers keep prompts arriving while 256 sequences decode */
  tc.output_max = 64;
  tc.arrivals_per_step = 16;
  /* no spec decode here: every block of a verifying request is shared (several rows read it), and the
   * graph tensors' shared bias of such a step runs to GiBs, which is PR 784's point, not this benchmark's */
  tc.spec_decode_share = 0.0;
  trace *tr = trace_create(&tc);
  if (!tr) {
    fprintf(stderr, "uattn-plan-bench: cannot create the trace\n");
    return 1;
  }
  counting counter = {{count_alloc, count_free, NULL}, 0};
  counter.hooks.user = &counter;
  uattn_plan_config pc = uattn_plan_config_default(bs, num_blocks, seqs, budget, max_len);
  pc.allocator = &counter.hooks;
  pc.shared_bias_byte_limit = (size_t)1 << 30;
  uattn_plan *plan;
  if (uattn_plan_create(&pc, &plan) != UATTN_OK) {
    fprintf(stderr, "uattn-plan-bench: %s\n", uattn_last_error());
    return 1;
  }
  uattn_step step;
  trace_step_mix mix;
  int found = 0;
  for (int i = 0; i < 5000 && !found; i++) {
    if (!trace_next(tr, &step, &mix)) break;
    int32_t tokens = mix.prefill_tokens + mix.decodes + mix.spec_tokens;
    found = step.num_reqs == seqs && tokens == budget && mix.prefills > 0 && mix.decodes > 0;
  }
  if (!found) {
    fprintf(stderr, "uattn-plan-bench: the trace never reached a full mixed step\n");
    return 1;
  }

  const unsigned seed_cpu_tensors =
      UATTN_GRAPH_CAUSAL_BIAS | UATTN_GRAPH_SHARED_BIAS | UATTN_GRAPH_UNIQUE_BIAS | UATTN_GRAPH_PADDED_IDS;
  uattn_graph_tensors tensors;
  /* one untimed step and materialization: the plan's buffers reach this batch's size */
  if (uattn_plan_step(plan, &step) != UATTN_OK || uattn_plan_materialize(plan, seed_cpu_tensors, &tensors)) {
    fprintf(stderr, "uattn-plan-bench: %s\n", uattn_last_error());
    return 1;
  }
  uattn_plan_info in;
  uattn_plan_get_info(plan, &in);
  const long allocs_before = counter.allocs;
  double *t = malloc(sizeof(double) * (size_t)o.repeat);
  for (int i = 0; i < o.repeat; i++) {
    double t0 = (perf_seconds() * 1e6);
    uattn_plan_step(plan, &step);
    t[i] = (perf_seconds() * 1e6) - t0;
  }
  const double plan_us = perf_median(t, o.repeat);
  for (int i = 0; i < o.repeat; i++) {
    double t0 = (perf_seconds() * 1e6);
    uattn_plan_step(plan, &step);
    uattn_plan_materialize(plan, seed_cpu_tensors, &tensors);
    t[i] = (perf_seconds() * 1e6) - t0;
  }
  const double bias_us = perf_median(t, o.repeat);
  const long step_allocs = counter.allocs - allocs_before;
  free(t);

  double seed_ms = -1, seed_bias_ms = -1;
  if (run_seed) {
    char path[] = "/tmp/uattn-plan-bench-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0 || write_batch(path, &pc, &step) != 0) {
      fprintf(stderr, "uattn-plan-bench: cannot write the batch for the reference\n");
      return 1;
    }
    int rc = time_seed(&o, path, &seed_ms, &seed_bias_ms);
    remove(path);
    if (rc) return 1;
  }

  if (o.json) {
    printf(
        "{\"batch\": {\"requests\": %d, \"tokens\": %d, \"prefills\": %d, \"decodes\": %d, \"spec_decodes\": %d, "
        "\"shared_blocks\": %d, \"shared_spans\": %d, \"unique_blocks\": %d},\n",
        in.num_reqs, in.num_tokens, mix.prefills, mix.decodes, mix.spec_decodes, in.num_shared_blocks,
        in.num_shared_spans, in.num_unique_blocks);
    printf(" \"uattn_plan_us\": %.2f, \"uattn_plan_with_seed_tensors_us\": %.2f, \"allocations_in_timed_steps\": %ld",
           plan_us, bias_us, step_allocs);
    if (run_seed)
      printf(
          ",\n \"seed_numpy_ms\": %.3f, \"seed_numpy_with_biases_ms\": %.3f, \"speedup\": %.1f, "
          "\"speedup_with_biases\": %.1f",
          seed_ms, seed_bias_ms, seed_ms * 1e3 / plan_us, seed_bias_ms * 1e3 / bias_us);
    printf("}\n");
  } else {
    printf("uattn planner benchmark: one serving step, medians of %d runs (uattn) and %d (numpy seed)\n", o.repeat,
           o.seed_repeat);
    printf(
        "  batch: %d requests (%d prompt chunks, %d decodes, %d spec-decode), %d tokens; %d shared blocks in %d "
        "spans, %d unique blocks; block size %d\n",
        in.num_reqs, mix.prefills, mix.decodes, mix.spec_decodes, in.num_tokens, in.num_shared_blocks,
        in.num_shared_spans, in.num_unique_blocks, bs);
    printf("  %-44s %12s %12s %9s\n", "", "uattn", "numpy seed", "speedup");
    if (run_seed) {
      printf("  %-44s %9.1f us %9.2f ms %8.0fx\n", "plan (metadata, no bias tensors)", plan_us, seed_ms,
             seed_ms * 1e3 / plan_us);
      printf("  %-44s %9.1f us %9.2f ms %8.0fx\n", "plan + graph-tensor biases on the CPU", bias_us, seed_bias_ms,
             seed_bias_ms * 1e3 / bias_us);
    } else {
      printf("  %-44s %9.1f us\n", "plan (metadata, no bias tensors)", plan_us);
      printf("  %-44s %9.1f us\n", "plan + graph-tensor biases on the CPU", bias_us);
    }
    printf("  allocations in the %d timed steps: %ld\n", 2 * o.repeat, step_allocs);
  }
  uattn_plan_destroy(plan);
  trace_destroy(tr);
  return 0;
}
