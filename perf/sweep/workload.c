/* uattn-sweep's workload: steps from the trace simulator or a trace file, their layout over a paged cache
 * for one block size, and the batch-bucketing sweep. See sweep.h. */
#include "sweep/sweep.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "common/random.h"
#include "support/fail.h"

/* ---- the workload --------------------------------------------------------------------------------------- */

static int add_step(sweep_workload *w, int32_t num_reqs, sweep_req **reqs) {
  sweep_step *s = realloc(w->steps, sizeof *s * (size_t)(w->num_steps + 1));
  if (!s) return -1;
  w->steps = s;
  s[w->num_steps].num_reqs = num_reqs;
  if (!(s[w->num_steps].reqs = calloc((size_t)(num_reqs ? num_reqs : 1), sizeof(sweep_req)))) return -1;
  *reqs = s[w->num_steps++].reqs;
  return 0;
}

/* Checks every request, derives the limits the steps need (a limit given below that is an error) and
 * counts the totals. */
static int check(sweep_workload *w, char *err, size_t cap) {
  if (w->num_steps == 0) return fail_with(err, cap, "%s: no steps", w->source);
  if (w->shared_prefix < 0) return fail_with(err, cap, "%s: shared_prefix must be >= 0", w->source);
  int32_t seqs = 0, tokens = 0, len = 0;
  for (int32_t i = 0; i < w->num_steps; i++) {
    const sweep_step *s = &w->steps[i];
    if (s->num_reqs == 0) return fail_with(err, cap, "%s: steps[%d] has no requests", w->source, i);
    int32_t step_tokens = 0;
    for (int32_t r = 0; r < s->num_reqs; r++) {
      const sweep_req *q = &s->reqs[r];
      if (q->computed < 0 || q->scheduled < 1 || q->prompt < 1 || q->drafts < 0 ||
          q->computed > INT32_MAX - q->scheduled)
        return fail_with(err, cap, "%s: steps[%d][%d]: need computed >= 0, scheduled >= 1, prompt >= 1, drafts >= 0",
                         w->source, i, r);
      if (q->drafts && (q->scheduled != q->drafts + 1 || q->computed < q->prompt))
        return fail_with(err, cap,
                         "%s: steps[%d][%d]: a verification (drafts %d) schedules drafts + 1 tokens after its prompt",
                         w->source, i, r, q->drafts);
      if (q->computed + q->scheduled > len) len = q->computed + q->scheduled;
      step_tokens += q->scheduled;
      w->query_tokens += q->scheduled;
      w->context_keys += q->computed;
      if (q->computed < q->prompt)
        w->prefill_tokens += q->scheduled;
      else if (q->drafts)
        w->verify_rows += q->scheduled;
      else
        w->decode_rows += q->scheduled;
    }
    if (s->num_reqs > seqs) seqs = s->num_reqs;
    if (step_tokens > tokens) tokens = step_tokens;
  }
  const char *names[] = {"max_num_seqs", "max_num_batched_tokens", "max_model_len"};
  int32_t *given[] = {&w->max_num_seqs, &w->max_num_batched_tokens, &w->max_model_len};
  const int32_t need[] = {seqs, tokens, len};
  for (int k = 0; k < 3; k++) {
    if (*given[k] == 0) *given[k] = need[k];
    if (*given[k] < need[k])
      return fail_with(err, cap, "%s: %s = %d but a step needs %d", w->source, names[k], *given[k], need[k]);
  }
  return 0;
}

/* The end of making w: checked, or freed. */
static int finish(sweep_workload *w, int rc, char *err, size_t cap) {
  if (rc == 0 && check(w, err, cap) == 0) return 0;
  sweep_workload_free(w);
  return -1;
}

int sweep_workload_generate(sweep_workload *w, const trace_config *tc, int32_t skip, int32_t stride, int32_t steps,
                            char *err, size_t cap) {
  memset(w, 0, sizeof *w);
  snprintf(w->source, sizeof w->source, "generated");
  trace *t = trace_create(tc);
  if (!t) return fail_with(err, cap, "the trace simulator refused its config (limits too small for the prompts?)");
  for (int32_t i = 0; w->num_steps < steps; i++) {
    uattn_step s;
    trace_step_mix mix;
    if (!trace_next(t, &s, &mix)) break;
    if (i < skip || (i - skip) % stride) continue;
    sweep_req *reqs;
    if (add_step(w, s.num_reqs, &reqs)) {
      trace_destroy(t);
      return finish(w, fail_with(err, cap, "out of memory"), err, cap);
    }
    for (int32_t r = 0; r < s.num_reqs; r++) {
      const int32_t entries = s.draft_offsets ? s.draft_offsets[r + 1] - s.draft_offsets[r] : 0;
      int32_t real = 0;
      for (int32_t d = 0; d < entries; d++) real += s.draft_tokens[s.draft_offsets[r] + d] != -1;
      reqs[r] =
          (sweep_req){s.num_computed[r], entries ? real + 1 : s.num_scheduled[r], s.num_prompt[r], entries ? real : 0};
    }
  }
  trace_destroy(t);
  w->shared_prefix = tc->system_prompt_len;
  w->max_num_seqs = tc->max_num_seqs;
  w->max_num_batched_tokens = tc->max_num_batched_tokens;
  w->max_model_len = tc->max_model_len;
  return finish(w, 0, err, cap);
}

/* Request k of step i of a trace file. */
static int read_req(uattn_json_reader *r, const cJSON *q, int32_t i, int32_t k, sweep_req *out) {
  static const char *const keys[] = {"computed", "scheduled", "prompt", "drafts"};
  char path[64], where[72]; /* where: path and a dot */
  snprintf(path, sizeof path, "steps[%d][%d]", i, k);
  snprintf(where, sizeof where, "%s.", path);
  if (uattn_json_expect(r, q, path, false, "an object") || uattn_json_check_keys(r, q, where, keys, 4) ||
      uattn_json_int(r, q, where, "computed", true, 0, 0, INT32_MAX, &out->computed) ||
      uattn_json_int(r, q, where, "scheduled", true, 0, 0, INT32_MAX, &out->scheduled) ||
      uattn_json_int(r, q, where, "prompt", true, 0, 0, INT32_MAX, &out->prompt) ||
      uattn_json_int(r, q, where, "drafts", false, 0, 0, INT32_MAX, &out->drafts))
    return -1;
  return 0;
}

static int read_trace(uattn_json_reader *r, sweep_workload *w, const char *path) {
  static const char *const top[] = {"description",   "shared_prefix", "max_num_seqs", "max_num_batched_tokens",
                                    "max_model_len", "steps"};
  cJSON *root = uattn_json_read_object(r, path, 0);
  const cJSON *steps = cJSON_GetObjectItemCaseSensitive(root, "steps");
  int rc = 0;
  if (!root || uattn_json_check_keys(r, root, "", top, 6) ||
      uattn_json_int(r, root, "", "shared_prefix", false, 0, 0, INT32_MAX, &w->shared_prefix) ||
      uattn_json_int(r, root, "", "max_num_seqs", false, 0, 0, INT32_MAX, &w->max_num_seqs) ||
      uattn_json_int(r, root, "", "max_num_batched_tokens", false, 0, 0, INT32_MAX, &w->max_num_batched_tokens) ||
      uattn_json_int(r, root, "", "max_model_len", false, 0, 0, INT32_MAX, &w->max_model_len) ||
      !uattn_json_required(r, root, "", "steps") || uattn_json_expect(r, steps, "steps", true, "an array of steps"))
    rc = -1;
  for (int32_t i = 0; rc == 0 && i < cJSON_GetArraySize(steps); i++) {
    const cJSON *step = cJSON_GetArrayItem(steps, i);
    char name[32];
    snprintf(name, sizeof name, "steps[%d]", i);
    sweep_req *reqs = NULL;
    if (uattn_json_expect(r, step, name, true, "an array of requests"))
      rc = -1;
    else if (add_step(w, cJSON_GetArraySize(step), &reqs))
      rc = uattn_json_refuse(r, UATTN_ERR_NO_MEMORY, "out of memory");
    for (int32_t k = 0; rc == 0 && k < w->steps[i].num_reqs; k++)
      rc = read_req(r, cJSON_GetArrayItem(step, k), i, k, &reqs[k]);
  }
  cJSON_Delete(root);
  return rc ? -1 : 0;
}

int sweep_workload_load(sweep_workload *w, const char *path, char *err, size_t cap) {
  memset(w, 0, sizeof *w);
  snprintf(w->source, sizeof w->source, "%s", path);
  char why[512];
  uattn_json_reader r = {.phrasing = UATTN_JSON_LIBRARY, .why = why, .cap = sizeof why};
  int rc = read_trace(&r, w, path);
  if (rc) fail_with(err, cap, "trace file %s: %s", path, why);
  return finish(w, rc, err, cap);
}

int sweep_workload_save(const sweep_workload *w, const char *path) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fprintf(f,
          "{\"description\": \"uattn-sweep workload (%s)\",\n \"shared_prefix\": %d, \"max_num_seqs\": %d, "
          "\"max_num_batched_tokens\": %d, \"max_model_len\": %d,\n \"steps\": [\n",
          w->source, w->shared_prefix, w->max_num_seqs, w->max_num_batched_tokens, w->max_model_len);
  for (int32_t i = 0; i < w->num_steps; i++) {
    fprintf(f, "  [");
    for (int32_t r = 0; r < w->steps[i].num_reqs; r++) {
      const sweep_req *q = &w->steps[i].reqs[r];
      fprintf(f, "%s{\"computed\": %d, \"scheduled\": %d, \"prompt\": %d", r ? ",\n   " : "", q->computed, q->scheduled,
              q->prompt);
      if (q->drafts) fprintf(f, ", \"drafts\": %d", q->drafts);
      fputc('}', f);
    }
    fprintf(f, "]%s\n", i + 1 < w->num_steps ? "," : "");
  }
  fprintf(f, " ]}\n");
  return fclose(f);
}

cJSON *sweep_workload_json(const sweep_workload *w) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "trace", w->source);
  cJSON_AddNumberToObject(o, "steps", w->num_steps);
  cJSON_AddNumberToObject(o, "shared_prefix", w->shared_prefix);
  cJSON_AddNumberToObject(o, "max_num_seqs", w->max_num_seqs);
  cJSON_AddNumberToObject(o, "max_num_batched_tokens", w->max_num_batched_tokens);
  cJSON_AddNumberToObject(o, "max_model_len", w->max_model_len);
  cJSON_AddNumberToObject(o, "query_tokens", (double)w->query_tokens);
  cJSON_AddNumberToObject(o, "prefill_tokens", (double)w->prefill_tokens);
  cJSON_AddNumberToObject(o, "decode_rows", (double)w->decode_rows);
  cJSON_AddNumberToObject(o, "verify_rows", (double)w->verify_rows);
  return o;
}

void sweep_workload_free(sweep_workload *w) {
  for (int32_t i = 0; i < w->num_steps; i++) free(w->steps[i].reqs);
  free(w->steps);
  memset(w, 0, sizeof *w);
}

/* ---- the layout over a paged cache -------------------------------------------------------------------- */

static int32_t ceil_div(int32_t a, int32_t b) { return (int32_t)(((int64_t)a + b - 1) / b); }

int sweep_layout_build(sweep_layout *l, const sweep_workload *w, int32_t bs) {
  memset(l, 0, sizeof *l);
  l->block_size = bs;
  l->stride = ceil_div(w->max_model_len, bs);
  const int32_t shared = w->shared_prefix / bs;
  int64_t most = 0;
  for (int32_t i = 0; i < w->num_steps; i++) {
    int64_t need = shared;
    for (int32_t r = 0; r < w->steps[i].num_reqs; r++) {
      const sweep_req *q = &w->steps[i].reqs[r];
      const int32_t mine = q->computed / bs < shared ? q->computed / bs : shared;
      need += ceil_div(q->computed + q->scheduled, bs) - mine;
    }
    if (need > most) most = need;
  }
  if (most * 3 / 2 + 1 > INT32_MAX / bs) return -1;
  l->num_blocks = (int32_t)(most * 3 / 2 + 1);
  int32_t *pool = malloc(sizeof(int32_t) * (size_t)l->num_blocks);
  l->steps = calloc((size_t)w->num_steps, sizeof *l->steps);
  if (!pool || !l->steps) {
    free(pool);
    return -1;
  }
  /* the private blocks in a shuffled order (fixed seed): an engine's cache is not in order */
  const int32_t free_blocks = l->num_blocks - shared;
  for (int32_t i = 0; i < free_blocks; i++) pool[i] = shared + i;
  uint64_t rng = 7;
  perf_random_shuffle(pool, free_blocks, &rng);
  l->num_steps = w->num_steps;
  int rc = 0;
  for (int32_t i = 0; i < w->num_steps && rc == 0; i++) {
    const sweep_step *s = &w->steps[i];
    const size_t n = (size_t)s->num_reqs;
    int32_t drafts = 0;
    for (size_t r = 0; r < n; r++) drafts += s->reqs[r].drafts;
    int32_t *computed = malloc(sizeof(int32_t) * n), *scheduled = malloc(sizeof(int32_t) * n);
    int32_t *prompt = malloc(sizeof(int32_t) * n), *table = malloc(sizeof(int32_t) * n * (size_t)l->stride);
    int32_t *offsets = drafts ? malloc(sizeof(int32_t) * (n + 1)) : NULL;
    int32_t *tokens = drafts ? malloc(sizeof(int32_t) * (size_t)drafts) : NULL;
    uattn_step *st = &l->steps[i];
    *st = (uattn_step){.num_reqs = s->num_reqs,
                       .num_computed = computed,
                       .num_scheduled = scheduled,
                       .num_prompt = prompt,
                       .block_table = table,
                       .block_table_stride = l->stride,
                       .draft_tokens = tokens,
                       .draft_offsets = offsets};
    if (!computed || !scheduled || !prompt || !table || (drafts && (!offsets || !tokens))) {
      rc = -1;
      break;
    }
    int32_t next = 0, d = 0;
    for (size_t r = 0; r < n; r++) {
      const sweep_req *q = &s->reqs[r];
      computed[r] = q->computed;
      scheduled[r] = q->scheduled;
      prompt[r] = q->prompt;
      int32_t *row = table + r * (size_t)l->stride;
      const int32_t mine = q->computed / bs < shared ? q->computed / bs : shared,
                    blocks = ceil_div(q->computed + q->scheduled, bs);
      for (int32_t b = 0; b < l->stride; b++) row[b] = b < mine ? b : (b < blocks ? pool[next++] : -1);
      if (offsets) {
        offsets[r] = d;
        for (int32_t k = 0; k < q->drafts; k++) tokens[d++] = 1;
      }
    }
    if (offsets) offsets[n] = d;
  }
  free(pool);
  if (rc) sweep_layout_free(l);
  return rc;
}

void sweep_layout_free(sweep_layout *l) {
  for (int32_t i = 0; l->steps && i < l->num_steps; i++) {
    free((void *)l->steps[i].num_computed);
    free((void *)l->steps[i].num_scheduled);
    free((void *)l->steps[i].num_prompt);
    free((void *)l->steps[i].block_table);
    free((void *)l->steps[i].draft_tokens);
    free((void *)l->steps[i].draft_offsets);
  }
  free(l->steps);
  memset(l, 0, sizeof *l);
}

uattn_plan_config sweep_plan_config(const sweep_workload *w, const sweep_layout *l) {
  return uattn_plan_config_default(l->block_size, l->num_blocks, w->max_num_seqs, w->max_num_batched_tokens,
                                   w->max_model_len);
}

/* ---- batch buckets -------------------------------------------------------------------------------------- */

enum { DIMS = 4, MAX_POINTS = 64 }; /* query tokens, shared blocks, unique blocks, logits */

/* A custom policy: per dimension, the first point of a sorted list that is >= the batch's size (powers of
 * two when pow2); past the last point, the exact size (a fallback). */
typedef struct policy_ranges {
  int32_t points[DIMS][MAX_POINTS];
  int32_t count[DIMS];
  bool pow2;
  int64_t fallbacks;
} policy_ranges;

/* The seed's range (docs/design.md, Bucketing) with n points instead of ten. */
static int32_t seed_range(int32_t min, int32_t max, int32_t round_up, int32_t n, int32_t *out) {
  int32_t count = 0;
  if (min == 0) {
    out[count++] = 0;
    min = 1;
  }
  if (max < min) max = min;
  for (int32_t i = 0; i < n; i++) {
    const double v = min * pow((double)max / min, (double)i / (n - 1));
    const int32_t p = i == n - 1 ? max : (int32_t)(ceil(v / round_up) * round_up);
    if (count == 0 || p > out[count - 1]) out[count++] = p;
  }
  return count;
}

static int32_t pad_dim(policy_ranges *p, int dim, int32_t v) {
  if (p->pow2) {
    int64_t x = 1;
    while (x < v) x *= 2;
    return v == 0 ? 0 : (x > INT32_MAX ? v : (int32_t)x);
  }
  for (int32_t i = 0; i < p->count[dim]; i++)
    if (p->points[dim][i] >= v) return p->points[dim][i];
  p->fallbacks++;
  return v;
}

static uattn_status pad_custom(void *user, bool contains_prompts, const uattn_bucket *exact, uattn_bucket *out) {
  (void)contains_prompts;
  policy_ranges *p = user;
  out->query_len = pad_dim(p, 0, exact->query_len);
  out->shared_blocks = pad_dim(p, 1, exact->shared_blocks);
  out->unique_blocks = pad_dim(p, 2, exact->unique_blocks);
  out->logits = pad_dim(p, 3, exact->logits);
  return UATTN_OK;
}

typedef struct policy {
  const char *name, *what;
  uattn_bucketing_mode mode;
  int32_t points; /* exponential points per range; 0 = powers of two */
} policy;

/* Shapes hit, and padded / real sums per dimension. */
typedef struct padding {
  int64_t real[DIMS], padded[DIMS], fallbacks;
  int32_t shapes;
  double set_size; /* buckets the policy defines (graphs an engine would build); 0 = unbounded */
} padding;

static int run_policy(const sweep_workload *w, const sweep_layout *l, const policy *po, padding *out) {
  memset(out, 0, sizeof *out);
  uattn_plan_config pc = sweep_plan_config(w, l);
  policy_ranges ranges;
  memset(&ranges, 0, sizeof ranges);
  pc.bucketing.mode = po->mode;
  if (po->mode == UATTN_BUCKETING_CUSTOM) {
    pc.bucketing.fn = pad_custom;
    pc.bucketing.fn_user = &ranges;
    ranges.pow2 = po->points == 0;
    const int32_t s = w->max_num_seqs, shared = l->stride < l->num_blocks ? l->stride : l->num_blocks;
    /* the seed's ranges; logits (which the seed pads to max_num_seqs) up to one per query token */
    const int32_t lo[DIMS] = {1, 0, 0, 1},
                  hi[DIMS] = {w->max_num_batched_tokens, shared, l->num_blocks, w->max_num_batched_tokens};
    const int32_t step[DIMS] = {s, s, s, 1};
    out->set_size = 1;
    for (int k = 0; k < DIMS; k++) {
      int32_t c = 0;
      if (ranges.pow2) {
        c = lo[k] == 0 ? 1 : 0;
        for (int64_t x = 1; x < 2 * (int64_t)hi[k]; x *= 2) c++;
      } else {
        c = ranges.count[k] = seed_range(lo[k], hi[k], step[k], po->points, ranges.points[k]);
      }
      if (k < 3) out->set_size *= c; /* shapes of (query, shared, unique), as the seed's list counts them */
    }
  }
  uattn_plan *plan;
  if (uattn_plan_create(&pc, &plan) != UATTN_OK) {
    fprintf(stderr, "uattn-sweep: bucketing %s: %s\n", po->name, uattn_last_error());
    return -1;
  }
  if (po->mode == UATTN_BUCKETING_EXPONENTIAL) {
    int32_t n = 0;
    uattn_plan_buckets(plan, NULL, NULL, 0, &n);
    out->set_size = n;
  }
  uattn_bucket *seen = malloc(sizeof *seen * (size_t)w->num_steps);
  for (int32_t i = 0; seen && i < w->num_steps; i++) {
    uattn_plan_info in;
    if (uattn_plan_step(plan, &l->steps[i]) != UATTN_OK || uattn_plan_get_info(plan, &in) != UATTN_OK) {
      fprintf(stderr, "uattn-sweep: bucketing %s, step %d: %s\n", po->name, i, uattn_last_error());
      free(seen);
      uattn_plan_destroy(plan);
      return -1;
    }
    const int32_t real[DIMS] = {in.num_tokens, in.num_shared_blocks, in.num_unique_blocks, in.num_logits};
    const int32_t padded[DIMS] = {in.padded.query_len, in.padded.shared_blocks, in.padded.unique_blocks,
                                  in.padded.logits};
    for (int k = 0; k < DIMS; k++) {
      out->real[k] += real[k];
      out->padded[k] += padded[k];
    }
    int32_t j = 0;
    while (j < out->shapes && memcmp(&seen[j], &in.padded, sizeof in.padded)) j++;
    if (j == out->shapes) seen[out->shapes++] = in.padded;
  }
  uattn_plan_stats stats;
  uattn_plan_get_stats(plan, &stats);
  out->fallbacks = stats.bucket_fallbacks + ranges.fallbacks;
  free(seen);
  uattn_plan_destroy(plan);
  return 0;
}

cJSON *sweep_batch_buckets(const sweep_workload *w, const sweep_layout *l, FILE *out) {
  static const policy policies[] = {
      {"seed", "the seed's ranges (10 points), filtered", UATTN_BUCKETING_EXPONENTIAL, 10},
      {"exp-5", "the seed's ranges with 5 points, unfiltered", UATTN_BUCKETING_CUSTOM, 5},
      {"exp-10", "the seed's ranges (10 points), unfiltered", UATTN_BUCKETING_CUSTOM, 10},
      {"exp-20", "the seed's ranges with 20 points, unfiltered", UATTN_BUCKETING_CUSTOM, 20},
      {"pow2", "each dimension up to a power of two", UATTN_BUCKETING_CUSTOM, 0},
      {"none", "exact shapes (no padding, a graph per shape)", UATTN_BUCKETING_NONE, 0},
  };
  static const char *const dims[DIMS] = {"query_tokens", "shared_blocks", "unique_blocks", "logits"};
  fprintf(out, "\nbatch buckets over the %d steps (block size %d): padded / real - 1, summed over the steps\n",
          w->num_steps, l->block_size);
  fprintf(out, "  %-8s %7s %9s %13s %14s %14s %8s %10s  %s\n", "policy", "shapes", "set size", "query tokens",
          "shared blocks", "unique blocks", "logits", "fallbacks", "what");
  cJSON *list = cJSON_CreateArray();
  for (size_t p = 0; p < sizeof policies / sizeof *policies; p++) {
    padding pad;
    if (run_policy(w, l, &policies[p], &pad)) {
      cJSON_Delete(list);
      return NULL;
    }
    cJSON *o = cJSON_CreateObject(), *waste = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "policy", policies[p].name);
    cJSON_AddStringToObject(o, "what", policies[p].what);
    cJSON_AddNumberToObject(o, "shapes_hit", pad.shapes);
    cJSON_AddNumberToObject(o, "set_size", pad.set_size);
    cJSON_AddNumberToObject(o, "fallbacks", (double)pad.fallbacks);
    char set[16];
    if (pad.set_size > 0)
      snprintf(set, sizeof set, "%.0f", pad.set_size);
    else
      snprintf(set, sizeof set, "-");
    fprintf(out, "  %-8s %7d %9s", policies[p].name, pad.shapes, set);
    const int width[DIMS] = {13, 14, 14, 8};
    for (int k = 0; k < DIMS; k++) {
      char cell[32];
      if (pad.real[k] > 0) {
        const double x = (double)pad.padded[k] / (double)pad.real[k] - 1;
        snprintf(cell, sizeof cell, "%+.1f%%", 100 * x);
        cJSON_AddNumberToObject(waste, dims[k], x);
      } else {
        snprintf(cell, sizeof cell, "%s", pad.padded[k] ? "inf" : "-");
      }
      fprintf(out, " %*s", width[k], cell);
    }
    fprintf(out, " %10lld  %s\n", (long long)pad.fallbacks, policies[p].what);
    cJSON_AddItemToObject(o, "waste", waste);
    cJSON_AddItemToArray(list, o);
  }
  fprintf(out,
          "  (shapes: distinct padded shapes the steps hit; set size: the shapes the policy defines, graphs an\n"
          "   engine would build: (query, shared, unique), the seed's list with and without the causal part;\n"
          "   unique blocks are counted against the real ones, while the seed's unique dimension is the largest\n"
          "   block id + 1, hence the waste of \"none\")\n");
  return list;
}
