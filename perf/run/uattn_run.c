/* uattn-run: replays one attention step dumped from an engine (a STEP.json and its .npy tensors), so a
 * mismatch or a slow step seen in production can be reproduced, inspected and timed outside the engine.
 *
 * It plans the step exactly as described (limits taken from the step itself, no bucketing), runs
 * uattn_forward on copies of the caches, and writes the output, the lse, the updated caches and the plan's
 * metadata. Every problem is one line on stderr naming the JSON key or the file, and exit status 2: an
 * engine developer fixes the dump, not this tool. The step's reading and checks are in step.c. */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/timing.h"
#include "convert.h"
#include "run/runner.h"
#include "support/npy.h"
#include "uattn.h"

#define EXIT_BAD 2

static const char usage_text[] =
    "usage: uattn-run STEP.json --out DIR [--repeat N] [--dump-biases]\n"
    "\n"
    "Replays one attention step dumped from an engine: plans it with uattn's planner (limits from the step,\n"
    "no bucketing), runs uattn_forward on copies of the caches and writes to DIR:\n"
    "  out.npy [T, Hq, Dv] f32, lse.npy [T, Hq] f32, key_cache.npy and value_cache.npy (after this step's\n"
    "  update, in the cache dtype and layout; kv_latent: no value_cache.npy), plan.json (the planner's metadata)\n"
    "\n"
    "  --out DIR       where to write (created if missing)\n"
    "  --repeat N      plan and run the step N more times on scratch caches; writes timing.json with the\n"
    "                  median plan and forward times in ms, each forward on cold CPU caches (as uattn-bench's)\n"
    "  --dump-biases   also write the graph tensors: causal_bias, shared_bias, shared_usage,\n"
    "                  unique_bias, unique_block_mapping, shared_blocks (.npy)\n"
    "  -h, --help      this text\n"
    "\n"
    "STEP.json keys: block_size num_blocks num_q_heads num_kv_heads head_dim dtype (f32|bf16|f16) cache_dtype\n"
    "(f32|bf16|f16|fp8_e4m3|fp8_e5m2) kv_layout (NHD|HND|TILED) scale soft_cap sliding_window attn_type\n"
    "(decoder|encoder) [causal_width chunk_size threads k_scale v_scale head_dim_v kv_latent] requests\n"
    "[{num_computed num_scheduled num_prompt block_table [draft_tokens]}] tensors {q k v key_cache value_cache\n"
    "[sinks alibi_slopes]}; tensor paths are relative to STEP.json. bf16 tensors are <u2 arrays of their bits,\n"
    "fp8 caches |u1 arrays of theirs; k_scale and v_scale (fp8 caches: the cache holds fp8(x / scale)) default\n"
    "to 1, finite and > 0. head_dim_v: Dv, the width of v, the value cache's rows and out (default: D).\n"
    "kv_latent: true for multi-head latent attention's absorbed form: each key's first head_dim_v dims are its\n"
    "value, so tensors names no v and no value_cache (0 < head_dim_v <= D, NHD or HND, v_scale = k_scale).\n"
    "Caches: NHD [num_blocks * block_size, Hkv, D], HND [num_blocks, Hkv, block_size, D], TILED (uattn.h; a\n"
    "block_size that is a multiple of 16, an even D) keys [num_blocks, block_size / 16, Hkv, D / 2, 16, 2],\n"
    "values [num_blocks, block_size / 16, Hkv, 8, Dv, 2]; value caches' rows are Dv long.\n"
    "Exit status: 0, or 2 with one line on stderr naming the key or file at fault.\n";

static volatile float evict_sink; /* what the eviction read sums, kept so that the read is done */

/* ---- the run ------------------------------------------------------------------------------------------ */

typedef struct run {
  runner_options o; /* STEP.json, --out, --repeat */
  bool dump_biases;

  step s;                        /* STEP.json and its tensors (step.h) */
  void *key_cache, *value_cache; /* the copies uattn_forward updates, on 2 MiB pages (uattn_cache_alloc) */
  size_t key_bytes, value_bytes; /* their sizes; value_cache NULL for a kv_latent step */
  void *out;
  float *lse;

  uattn_plan *plan;
  uattn_runtime *rt;
} run;

static void run_free(run *r) {
  step_free(&r->s);
  uattn_cache_free(r->key_cache, r->key_bytes);
  uattn_cache_free(r->value_cache, r->value_bytes);
  free(r->out);
  free(r->lse);
  uattn_plan_destroy(r->plan);
  uattn_runtime_destroy(r->rt);
}

/* ---- output ------------------------------------------------------------------------------------------ */

static int write_npy(const run *r, const char *name, npy_dtype dtype, int ndim, const int64_t *shape,
                     const void *data) {
  return step_write_npy(r->o.out_dir, name, dtype, ndim, shape, data, runner_error, sizeof runner_error);
}

/* The graph tensors. The shared bias goes alone first: the planner refuses it above its byte limit,
 * and that refusal must not cost the others. */
static int dump_biases(run *r) {
  uattn_graph_tensors s;
  const int64_t bs = r->s.block_size;
  uattn_status st = uattn_plan_materialize(r->plan, UATTN_GRAPH_SHARED_BIAS, &s);
  if (st == UATTN_ERR_TOO_LARGE) {
    fprintf(stderr, "uattn-run: warning: shared_bias.npy skipped (UATTN_ERR_TOO_LARGE): %s\n", uattn_last_error());
  } else if (st != UATTN_OK) {
    return runner_fail_lib("uattn_plan_materialize", st);
  } else {
    const int64_t shape[] = {s.shape.query_len, s.shape.shared_blocks, bs};
    if (write_npy(r, "shared_bias.npy", NPY_F4, 3, shape, s.shared_bias)) return -1;
  }
  st =
      uattn_plan_materialize(r->plan, UATTN_GRAPH_CAUSAL_BIAS | UATTN_GRAPH_SHARED_USAGE | UATTN_GRAPH_UNIQUE_BIAS, &s);
  if (st != UATTN_OK) return runner_fail_lib("uattn_plan_materialize", st);
  const int64_t tq = s.shape.query_len, ts = s.shape.shared_blocks, tu = s.shape.unique_blocks;
  const int64_t causal[] = {tq, tq}, usage[] = {tq, ts}, ubias[] = {tu, bs}, umap[] = {tu}, shared[] = {ts};
  if (write_npy(r, "causal_bias.npy", NPY_F4, 2, causal, s.causal_bias) ||
      write_npy(r, "shared_usage.npy", NPY_I4, 2, usage, s.shared_usage) ||
      write_npy(r, "unique_bias.npy", NPY_F4, 2, ubias, s.unique_bias) ||
      write_npy(r, "unique_block_mapping.npy", NPY_I4, 1, umap, s.unique_block_mapping))
    return -1;
  /* padded to the bucket like the other graph tensors, with the seed's -1 for a missing id */
  uattn_plan_info in;
  uattn_plan_get_info(r->plan, &in);
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)(ts ? ts : 1));
  if (!ids) return runner_fail("shared_blocks.npy: out of memory");
  for (int64_t i = 0; i < ts; i++) ids[i] = i < in.num_shared_blocks ? in.shared_blocks[i] : -1;
  const int rc = write_npy(r, "shared_blocks.npy", NPY_I4, 1, shared, ids);
  free(ids);
  return rc;
}

/* ---- running ------------------------------------------------------------------------------------------ */

static int execute(run *r) {
  if (step_make_dir(r->o.out_dir, runner_error, sizeof runner_error)) return -1;
  uattn_plan_info in;
  if (runner_plan_step(&r->s, "uattn-run", &r->plan, &in)) return -1;
  const uattn_step batch = step_batch(&r->s);
  uattn_status st;

  const size_t rows = (size_t)r->s.num_tokens * (size_t)r->s.hq;
  const size_t key_bytes = r->s.t[STEP_KEY_CACHE].a.count * uattn_dtype_size(r->s.cache_dtype);
  const size_t value_bytes = r->s.t[STEP_VALUE_CACHE].a.count * uattn_dtype_size(r->s.cache_dtype);
  /* on 2 MiB pages, as an engine should give them and as uattn-bench times them: a decode reads blocks all
   * over the cache, and on 4 KiB pages each 4 KiB costs a TLB miss */
  r->key_bytes = key_bytes ? key_bytes : 1;
  r->value_bytes = value_bytes ? value_bytes : 1;
  if (uattn_cache_alloc(r->key_bytes, &r->key_cache) ||
      (!r->s.kv_latent && uattn_cache_alloc(r->value_bytes, &r->value_cache)))
    return runner_fail("out of memory for the caches");
  r->out = malloc(rows * (size_t)r->s.head_dim_v * uattn_dtype_size(r->s.dtype) + 1);
  r->lse = malloc(sizeof(float) * rows + 1);
  if (!r->out || !r->lse) return runner_fail("out of memory for the outputs");
  memcpy(r->key_cache, r->s.t[STEP_KEY_CACHE].a.data, key_bytes);
  if (r->value_cache) memcpy(r->value_cache, r->s.t[STEP_VALUE_CACHE].a.data, value_bytes);

  const uattn_layer layer = step_layer(&r->s);
  uattn_tensors t = runner_tensors(&r->s, r->key_cache, r->value_cache, r->s.num_blocks, r->out, r->lse);
  if (runner_runtime(r->s.threads, &r->rt)) return -1;
  if ((st = uattn_forward(r->plan, &layer, &t, r->rt))) return runner_fail_lib("uattn_forward", st);

  if (step_write_results(&r->s, r->o.out_dir, r->out, r->lse, r->key_cache, r->value_cache, runner_error,
                         sizeof runner_error) ||
      step_write_plan(&in, r->o.out_dir, runner_error, sizeof runner_error))
    return -1;
  if (r->dump_biases && dump_biases(r)) return -1;
  printf(
      "uattn-run: %d requests, %d query rows, %d sampled; %d shared blocks (%d spans), %d unique blocks; "
      "wrote %s\n",
      in.num_reqs, in.num_tokens, in.num_logits, in.num_shared_blocks, in.num_shared_spans, in.num_unique_blocks,
      r->o.out_dir);
  if (!r->o.repeat) return 0;

  /* the timed runs start from the step's own caches each time, in the same buffers: the files are written.
   * Copying them back leaves their last tens of MiB in L2 and L3, which a forward would then read at cache
   * speed, where an engine's step reads a layer's cache last touched a whole step before; so each forward
   * starts after a read of 4x the L3 (at least 64 MiB) that evicts them, as uattn-bench's runs do. */
  uattn_topology topo;
  const size_t l3 =
      uattn_runtime_get_topology(r->rt, &topo) == UATTN_OK && topo.l3_bytes ? topo.l3_bytes : (size_t)32 << 20;
  const size_t evict_floats = (4 * l3 > ((size_t)64 << 20) ? 4 * l3 : (size_t)64 << 20) / sizeof(float);
  double *plan_ms = malloc(sizeof(double) * (size_t)r->o.repeat),
         *fwd_ms = malloc(sizeof(double) * (size_t)r->o.repeat);
  float *evict = malloc(evict_floats * sizeof(float));
  int rc = -1;
  if (evict) memset(evict, 0, evict_floats * sizeof(float)); /* written: untouched pages would all be one zero page */
  if (!plan_ms || !fwd_ms || !evict) {
    runner_fail("--repeat: out of memory");
    goto done;
  }
  for (int i = 0; i < r->o.repeat; i++) {
    memcpy(r->key_cache, r->s.t[STEP_KEY_CACHE].a.data, key_bytes);
    if (r->value_cache) memcpy(r->value_cache, r->s.t[STEP_VALUE_CACHE].a.data, value_bytes);
    float sum = 0.0f;
    for (size_t k = 0; k < evict_floats; k += 16) sum += evict[k]; /* a line each */
    evict_sink = sum;
    const double t0 = (perf_seconds() * 1e3);
    if ((st = uattn_plan_step(r->plan, &batch))) {
      runner_fail_lib("uattn_plan_step (repeat)", st);
      goto done;
    }
    const double t1 = (perf_seconds() * 1e3);
    if ((st = uattn_forward(r->plan, &layer, &t, r->rt))) {
      runner_fail_lib("uattn_forward (repeat)", st);
      goto done;
    }
    plan_ms[i] = t1 - t0;
    fwd_ms[i] = (perf_seconds() * 1e3) - t1;
  }
  cJSON *timing = cJSON_CreateObject();
  if (!timing || !cJSON_AddNumberToObject(timing, "forward_ms", perf_median(fwd_ms, r->o.repeat)) ||
      !cJSON_AddNumberToObject(timing, "plan_ms", perf_median(plan_ms, r->o.repeat)) ||
      !cJSON_AddNumberToObject(timing, "repeat", r->o.repeat) ||
      !cJSON_AddNumberToObject(timing, "threads", runner_workers(r->rt))) {
    cJSON_Delete(timing);
    runner_fail("timing.json: out of memory");
    goto done;
  }
  rc = step_write_json(r->o.out_dir, "timing.json", timing, runner_error, sizeof runner_error);
  if (!rc)
    printf("uattn-run: median of %d runs: plan %.3f ms, forward %.3f ms\n", r->o.repeat,
           cJSON_GetObjectItem(timing, "plan_ms")->valuedouble, cJSON_GetObjectItem(timing, "forward_ms")->valuedouble);
  cJSON_Delete(timing);
done:
  free(plan_ms);
  free(fwd_ms);
  free(evict);
  return rc;
}

/* ---- main --------------------------------------------------------------------------------------------- */

/* --dump-biases, uattn-run's own option. */
static int own_option(void *tool, int argc, char **argv, int *i) {
  (void)argc;
  if (strcmp(argv[*i], "--dump-biases")) return 1;
  ((run *)tool)->dump_biases = true;
  return 0;
}

int main(int argc, char **argv) {
  run r;
  memset(&r, 0, sizeof r);
  const int parsed = runner_parse_args(argc, argv, &r.o, own_option, &r, "");
  if (parsed == 1) {
    fputs(usage_text, stdout);
    return 0;
  }
  if (parsed) {
    fprintf(stderr, "uattn-run: %s\n%s", runner_error, usage_text);
    return EXIT_BAD;
  }
  const int rc = step_read(&r.s, r.o.json_path, runner_error, sizeof runner_error) || execute(&r);
  if (rc) fprintf(stderr, "uattn-run: %s\n", runner_error);
  run_free(&r);
  return rc ? EXIT_BAD : 0;
}
