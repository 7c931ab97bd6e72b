/* uattn-demo: the main job. Serves a continuous-batching trace (a shared system prompt, chunked prefills,
 * decodes, spec-decode verification) and plans every step the way an engine would call uattn, printing
 * what each step holds and how long planning took. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "trace.h"
#include "uattn.h"

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static int compare_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int fail(const char *what) {
  fprintf(stderr, "uattn-demo: %s: %s\n", what, uattn_last_error());
  return 1;
}

int main(int argc, char **argv) {
  int32_t steps = 400;
  if (argc > 1) steps = atoi(argv[1]);
  if (steps <= 0) {
    fprintf(stderr, "usage: uattn-demo [STEPS]\n");
    return 2;
  }
  /* a Llama-3-8B-like serving setup: block 128, 8k context, 64 sequences, 2048-token steps */
  const int32_t bs = 128, num_blocks = 4096, max_seqs = 64, budget = 2048, max_len = 8192;
  trace_config tc = trace_config_default(bs, num_blocks, max_seqs, budget, max_len);
  tc.system_prompt_len = 1024;
  tc.prompt_max = 2048;
  tc.output_max = 1024;
  trace *tr = trace_create(&tc);
  if (!tr) {
    fprintf(stderr, "uattn-demo: cannot create the trace\n");
    return 1;
  }
  uattn_plan_config pc = uattn_plan_config_default(bs, num_blocks, max_seqs, budget, max_len);
  pc.bucketing.mode = UATTN_BUCKETING_SEED;
  uattn_plan *plan;
  if (uattn_plan_create(&pc, &plan) != UATTN_OK) return fail("plan_create");
  int32_t nbuckets = 0;
  if (uattn_plan_buckets(plan, NULL, NULL, 0, &nbuckets) != UATTN_OK) return fail("plan_buckets");

  printf("uattn %s demo: planning %d steps of a serving trace\n", uattn_version(), steps);
  printf("  block %d, %d blocks, up to %d sequences and %d tokens a step, %d-token system prompt shared by all\n",
         bs, num_blocks, max_seqs, budget, tc.system_prompt_len);
  printf("  seed bucketing: %d buckets\n\n", nbuckets);
  printf("%6s %5s %9s %9s %7s %7s %7s %7s  %-22s %8s\n", "step", "reqs", "prefill", "decode", "spec", "tokens",
         "shared", "unique", "bucket (q,s,u,logits)", "plan us");

  double *times = malloc(sizeof(double) * (size_t)steps);
  long long tokens = 0, padded_tokens = 0, prefill_tokens = 0, decode_tokens = 0, spec_tokens = 0, finished = 0;
  long long shared_reads = 0, unique_reads = 0, spec_fallbacks = 0;
  uattn_plan_stats created;
  uattn_plan_get_stats(plan, &created);
  int32_t done = 0;
  for (; done < steps; done++) {
    uattn_step step;
    trace_step_mix mix;
    if (!trace_next(tr, &step, &mix)) break;
    const double t0 = now_us();
    if (uattn_plan_step(plan, &step) != UATTN_OK) return fail("plan_step");
    times[done] = now_us() - t0;
    uattn_plan_info in;
    uattn_plan_get_info(plan, &in);
    tokens += in.num_tokens;
    padded_tokens += in.padded.query_len;
    prefill_tokens += mix.prefill_tokens;
    decode_tokens += mix.decodes;
    spec_tokens += mix.spec_tokens;
    finished += mix.finished;
    shared_reads += in.num_shared_spans;
    unique_reads += in.num_unique_blocks;
    spec_fallbacks += in.bucket_fallback && mix.spec_decodes > 0;
    if (done % 25 == 0 || done == steps - 1) {
      char bucket[64];
      snprintf(bucket, sizeof bucket, "(%d,%d,%d,%d)%s", in.padded.query_len, in.padded.shared_blocks,
               in.padded.unique_blocks, in.padded.logits, in.bucket_fallback ? "*" : "");
      printf("%6d %5d %4d/%-4d %9d %3d/%-3d %7d %7d %7d  %-22s %8.1f\n", done, in.num_reqs, mix.prefills,
             mix.prefill_tokens, mix.decodes, mix.spec_decodes, mix.spec_tokens, in.num_tokens,
             in.num_shared_blocks, in.num_unique_blocks, bucket, times[done]);
    }
  }
  uattn_plan_stats end;
  uattn_plan_get_stats(plan, &end);
  qsort(times, (size_t)done, sizeof *times, compare_double);
  double total = 0;
  for (int32_t i = 0; i < done; i++) total += times[i];

  printf("\nsummary\n");
  printf("  steps planned        %d (%lld requests finished)\n", done, finished);
  printf("  query tokens         %lld: %lld prefill, %lld decode, %lld spec-decode verification\n", tokens,
         prefill_tokens, decode_tokens, spec_tokens);
  printf("  context reads        %lld shared (block, request) spans, %lld unique blocks\n", shared_reads,
         unique_reads);
  printf("  plan time            median %.1f us, p99 %.1f us, %.2f M tokens/s planned\n", times[done / 2],
         times[(done * 99) / 100], tokens / total);
  printf("  bucketing            %lld padded query tokens for %lld real (%.1f%% padding); %lld steps fit no\n"
         "                       seed bucket (marked *) and ran at their exact shape\n",
         padded_tokens, tokens, 100.0 * (padded_tokens - tokens) / (double)(padded_tokens ? padded_tokens : 1),
         (long long)end.bucket_fallbacks);
  if (spec_fallbacks)
    printf("                       (%lld of them verify drafts: every block a verifying request reads is shared\n"
           "                       by its rows, and the seed's ranges allow max_model_len / block_size = %d shared\n"
           "                       blocks and max_num_seqs = %d queries without prompts)\n",
           spec_fallbacks, max_len / bs, max_seqs);
  printf("  allocations          %lld when the plan was created, %lld during the %d steps (%.1f MiB held)\n",
         (long long)created.allocations, (long long)(end.allocations - created.allocations), done,
         end.bytes_reserved / 1048576.0);
  free(times);
  uattn_plan_destroy(plan);
  trace_destroy(tr);
  return 0;
}
