/* uattn-demo: the main job. Serves a continuous-batching trace (requests sharing a system prompt, chunked
 * prefills, decodes, spec-decode verification) through one Llama-3-8B-like attention layer (32 query heads,
 * 8 KV heads, head dim 128, block 128, bf16): every step is planned and run the way an engine calls uattn,
 * a sample of steps is checked against the dense double-precision oracle, and throughput is reported by the
 * kind of work each step held. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/dense_oracle.h"
#include "common/random.h"
#include "common/tensors.h"
#include "common/timing.h"
#include "common/trace.h"
#include "uattn.h"

enum { HQ = 32, HKV = 8, HEAD_DIM = 128, BLOCK = 128 };

static int fail(const char *what) {
  fprintf(stderr, "uattn-demo: %s: %s\n", what, uattn_last_error());
  return 1;
}

/* A KV cache as an engine should take it: interleaved over rt's NUMA nodes, else (placement refused, as in
 * some containers) placed by first touch. */
static uattn_status alloc_cache(const uattn_runtime *rt, size_t bytes, void **out) {
  const uattn_status st = uattn_runtime_cache_alloc(rt, bytes, out);
  return st == UATTN_ERR_UNSUPPORTED ? uattn_cache_alloc(bytes, out) : st;
}

static uint64_t rng_state = 12345;
static double unit(void) { return (double)(perf_random_next(&rng_state) >> 11) * 0x1.0p-53; }

static void fill_bf16(uint16_t *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = oracle_float_to_bf16((float)(2.0 * unit() - 1.0));
}

/* Work of a step, for throughput: visible (query, key) pairs times heads times 4 * head_dim flops. */
static double step_flops(const uattn_plan_info *in) {
  double pairs = 0;
  for (int32_t r = 0; r < in->num_reqs; r++)
    for (int32_t t = in->query_start_loc[r]; t < in->query_start_loc[r + 1]; t++) pairs += in->token_positions[t] + 1;
  return pairs * HQ * 4.0 * HEAD_DIM;
}

typedef struct phase {
  const char *name;
  int steps;
  double tokens, seconds, flops;
} phase;

/* Checks `rows` sampled rows of the step against the oracle; returns the worst error relative to the
 * largest reference magnitude. */
static double check_sample(const uattn_step *step, const uattn_plan_info *in, const uattn_layer *L,
                           const uattn_tensors *t, int32_t samples) {
  int32_t effective[1024], rows[64];
  for (int32_t r = 0; r < in->num_reqs; r++) effective[r] = in->num_scheduled[r];
  const oracle_step os = {in->num_reqs,
                          BLOCK,
                          step->num_computed,
                          effective,
                          step->num_prompt,
                          step->block_table,
                          step->block_table_stride};
  if (samples > in->num_tokens) samples = in->num_tokens;
  for (int32_t i = 0; i < samples; i++) rows[i] = (int32_t)(unit() * in->num_tokens);
  double *ref = malloc(sizeof(double) * (size_t)samples * HQ * HEAD_DIM);
  if (!ref || oracle_attention_rows(&os, L, t, samples, rows, ref, NULL) != 0) {
    fprintf(stderr, "uattn-demo: oracle: %s\n", oracle_last_error());
    exit(1);
  }
  double scale = 0, err = 0;
  for (int32_t i = 0; i < samples; i++)
    for (int32_t x = 0; x < HQ * HEAD_DIM; x++) {
      const double want = ref[(size_t)i * HQ * HEAD_DIM + x];
      const double got = oracle_load(t->out, UATTN_BF16, (size_t)rows[i] * HQ * HEAD_DIM + x);
      scale = fmax(scale, fabs(want));
      err = fmax(err, fabs(got - want));
    }
  free(ref);
  return err / fmax(scale, 1e-30);
}

int main(int argc, char **argv) {
  int32_t steps = 48;
  if (argc > 1) steps = atoi(argv[1]);
  if (steps <= 0) {
    fprintf(stderr, "usage: uattn-demo [STEPS]\n");
    return 2;
  }
  const int32_t num_blocks = 768, max_seqs = 32, budget = 512, max_len = 4096;
  trace_config tc = trace_config_default(BLOCK, num_blocks, max_seqs, budget, max_len);
  tc.system_prompt_len = 512;
  tc.prompt_min = 64;
  tc.prompt_max = 512;
  tc.output_min = 8;
  tc.output_max = 96;
  tc.arrivals_per_step = 3;
  trace *tr = trace_create(&tc);
  if (!tr) {
    fprintf(stderr, "uattn-demo: cannot create the trace\n");
    return 1;
  }
  uattn_plan_config pc = uattn_plan_config_default(BLOCK, num_blocks, max_seqs, budget, max_len);
  uattn_plan *plan;
  if (uattn_plan_create(&pc, &plan) != UATTN_OK) return fail("plan_create");

  uattn_runtime *rt; /* one worker per core ($UATTN_NUM_THREADS to change) */
  if (uattn_runtime_create(NULL, &rt) != UATTN_OK) return fail("runtime_create");
  uattn_topology topo;
  uattn_runtime_get_topology(rt, &topo);
  uattn_layer L = uattn_layer_default(HQ, HKV, HEAD_DIM, UATTN_BF16);
  const size_t cache_elems = (size_t)num_blocks * BLOCK * HKV * HEAD_DIM;
  /* the caches on 2 MiB pages (decodes read them all over), spread over the runtime's NUMA nodes; where the
   * system refuses placement, placed by first touch */
  void *key_cache = NULL, *value_cache = NULL;
  if (alloc_cache(rt, cache_elems * 2, &key_cache) || alloc_cache(rt, cache_elems * 2, &value_cache))
    return fail("cache_alloc");
  uint16_t *q = malloc((size_t)budget * HQ * HEAD_DIM * 2), *k = malloc((size_t)budget * HKV * HEAD_DIM * 2);
  uint16_t *v = malloc((size_t)budget * HKV * HEAD_DIM * 2), *out = malloc((size_t)budget * HQ * HEAD_DIM * 2);
  if (!q || !k || !v || !out) {
    fprintf(stderr, "uattn-demo: out of memory\n");
    return 1;
  }
  /* the shared system prompt's blocks are cached from the start (the trace's prefix-cache hit) */
  fill_bf16(key_cache, cache_elems);
  fill_bf16(value_cache, cache_elems);

  printf("uattn %s demo: serving %d steps through one attention layer\n", uattn_version(), steps);
  printf("  layer: %d query heads, %d KV heads, head dim %d, bf16 in and in the paged cache (block %d, %d blocks)\n",
         HQ, HKV, HEAD_DIM, BLOCK, num_blocks);
  const char *why;
  const char *kernels = uattn_kernel_set(&why);
  printf("  runtime: %d threads on %d cores (L2 %zu KiB, L3 %zu MiB); kernels: %s (%s)\n", topo.num_workers,
         topo.usable.cores, topo.l2_bytes >> 10, topo.l3_bytes >> 20, kernels, why);
  printf(
      "  trace: up to %d sequences and %d tokens a step, a %d-token system prompt shared by every request,\n"
      "         chunked prefills, decodes, and spec-decode verification of up to %d drafts\n\n",
      max_seqs, budget, tc.system_prompt_len, tc.num_spec_tokens);

  phase phases[3] = {
      {"prefill-heavy steps", 0, 0, 0, 0}, {"mixed steps", 0, 0, 0, 0}, {"decode-only steps", 0, 0, 0, 0}};
  const bool tty = isatty(STDOUT_FILENO);
  double worst_error = 0, plan_seconds = 0;
  int checked = 0;
  long long finished = 0, prefill_tokens = 0, decode_tokens = 0, spec_tokens = 0, shared_blocks = 0;
  const double t_start = perf_seconds();
  int32_t done = 0;
  for (; done < steps; done++) {
    uattn_step step;
    trace_step_mix mix;
    if (!trace_next(tr, &step, &mix)) break;
    double t0 = perf_seconds();
    if (uattn_plan_step(plan, &step) != UATTN_OK) return fail("plan_step");
    plan_seconds += perf_seconds() - t0;
    uattn_plan_info in;
    uattn_plan_get_info(plan, &in);
    fill_bf16(q, (size_t)in.num_tokens * HQ * HEAD_DIM);
    fill_bf16(k, (size_t)in.num_tokens * HKV * HEAD_DIM);
    fill_bf16(v, (size_t)in.num_tokens * HKV * HEAD_DIM);
    const uattn_tensors t = perf_tensors(q, k, v, key_cache, value_cache, num_blocks, BLOCK, out);
    t0 = perf_seconds();
    if (uattn_forward(plan, &L, &t, rt) != UATTN_OK) return fail("forward");
    const double seconds = perf_seconds() - t0;

    const int kind = mix.prefill_tokens * 2 > in.num_tokens ? 0 : (mix.prefills > 0 ? 1 : 2);
    phases[kind].steps++;
    phases[kind].tokens += in.num_tokens;
    phases[kind].seconds += seconds;
    phases[kind].flops += step_flops(&in);
    prefill_tokens += mix.prefill_tokens;
    decode_tokens += mix.decodes;
    spec_tokens += mix.spec_tokens;
    finished += mix.finished;
    shared_blocks += in.num_shared_blocks;

    if (done % 6 == 0) { /* the oracle on a sample of rows of every sixth step */
      const double e = check_sample(&step, &in, &L, &t, 12);
      worst_error = fmax(worst_error, e);
      checked++;
      if (e > 4e-3) {
        fprintf(stderr, "uattn-demo: step %d differs from the oracle: %.3g relative (bf16 allows 4e-3)\n", done, e);
        return 1;
      }
    }
    const double elapsed = perf_seconds() - t_start, eta = elapsed / (done + 1) * (steps - done - 1);
    if (tty)
      printf("\r  step %3d/%d  %3d reqs  %4d tokens (%3d prefill, %2d decode, %2d verify)  %6.1f ms  eta %4.0f s ",
             done + 1, steps, in.num_reqs, in.num_tokens, mix.prefill_tokens, mix.decodes, mix.spec_tokens,
             seconds * 1e3, eta);
    else if (done % 8 == 0 || done == steps - 1)
      printf("  step %3d/%d  %3d reqs  %4d tokens (%3d prefill, %2d decode, %2d verify)  %6.1f ms\n", done + 1, steps,
             in.num_reqs, in.num_tokens, mix.prefill_tokens, mix.decodes, mix.spec_tokens, seconds * 1e3);
    fflush(stdout);
  }
  if (tty) printf("\n");

  printf("\nsummary (%d steps in %.1f s, %d threads, the %s kernel set)\n", done, perf_seconds() - t_start,
         topo.num_workers, uattn_kernel_set(NULL));
  printf("  %-22s %6s %8s %12s %12s\n", "", "steps", "tokens", "tokens/s", "GFLOP/s");
  for (int i = 0; i < 3; i++)
    if (phases[i].steps)
      printf("  %-22s %6d %8.0f %12.0f %12.2f\n", phases[i].name, phases[i].steps, phases[i].tokens,
             phases[i].tokens / phases[i].seconds, phases[i].flops / phases[i].seconds * 1e-9);
  printf("  query tokens            %lld prefill, %lld decode, %lld spec-decode verification; %lld requests finished\n",
         prefill_tokens, decode_tokens, spec_tokens, finished);
  printf("  shared context          %.1f shared blocks a step on average (the system prompt, verification)\n",
         done ? (double)shared_blocks / done : 0.0);
  printf("  planning                %.1f us a step on average\n", done ? plan_seconds / done * 1e6 : 0.0);
  printf(
      "  correctness             %d sampled steps match the dense fp64 oracle: worst error %.2g of the largest\n"
      "                          output (bf16 output rounding allows 4e-3)\n",
      checked, worst_error);
  uattn_cache_free(key_cache, cache_elems * 2);
  uattn_cache_free(value_cache, cache_elems * 2);
  free(q);
  free(k);
  free(v);
  free(out);
  uattn_plan_destroy(plan);
  uattn_runtime_destroy(rt);
  trace_destroy(tr);
  return 0;
}
