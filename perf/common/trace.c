#include "common/trace.h"

#include <stdlib.h>
#include <string.h>

#include "common/random.h"

typedef struct request {
  int32_t prompt_len, output_len, num_computed, generated, spec;
} request;

struct trace {
  trace_config c;
  uint64_t rng;
  int32_t stride;        /* block-table entries per request */
  int32_t shared_blocks; /* system-prompt blocks, ids [0, shared_blocks) */
  int32_t *free_blocks, num_free;
  int32_t num_reqs, waiting;
  request *reqs;
  int32_t *block_table; /* [max_num_seqs, stride], rows follow reqs */
  int32_t *token_ids;   /* [max_num_seqs, max_model_len] */
  /* the step handed out: the scheduled requests' rows, gathered */
  int32_t *num_computed, *num_scheduled, *num_prompt, *draft_tokens, *draft_offsets;
  int32_t *step_table, *step_ids;
  /* what the step handed out schedules, applied at the next call (the step stays valid until then) */
  int32_t *last_slot, *last_tokens, last_batch;
};

trace_config trace_config_default(int32_t block_size, int32_t num_blocks, int32_t max_num_seqs,
                                  int32_t max_num_batched_tokens, int32_t max_model_len) {
  trace_config c = {
      .block_size = block_size,
      .num_blocks = num_blocks,
      .max_num_seqs = max_num_seqs,
      .max_num_batched_tokens = max_num_batched_tokens,
      .max_model_len = max_model_len,
      .system_prompt_len = max_model_len / 8,
      .prompt_min = 32,
      .prompt_max = max_model_len / 4,
      .output_min = 16,
      .output_max = max_model_len / 4,
      .spec_decode_share = 0.25,
      .num_spec_tokens = 4,
      .arrivals_per_step = 4,
      .seed = 42,
  };
  return c;
}

static int32_t uniform(trace *t, int32_t lo, int32_t hi) {
  return hi <= lo ? lo : lo + (int32_t)(perf_random_next(&t->rng) % (uint64_t)(hi - lo + 1));
}

static int32_t random_token(trace *t) { return uniform(t, 0, 127999); }

trace *trace_create(const trace_config *c) {
  if (c->block_size <= 0 || c->num_blocks <= 0 || c->max_num_seqs <= 0 || c->max_num_batched_tokens <= 0 ||
      c->max_model_len <= c->system_prompt_len + c->prompt_max + c->output_max + c->num_spec_tokens ||
      c->prompt_min < 1 || c->prompt_max < c->prompt_min || c->output_min < 1 || c->output_max < c->output_min)
    return NULL;
  trace *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->c = *c;
  t->rng = c->seed;
  t->stride = (c->max_model_len + c->block_size - 1) / c->block_size;
  t->shared_blocks = c->system_prompt_len / c->block_size;
  const size_t nr = (size_t)c->max_num_seqs;
  t->free_blocks = malloc(sizeof(int32_t) * (size_t)c->num_blocks);
  t->reqs = calloc(nr, sizeof *t->reqs);
  t->block_table = malloc(sizeof(int32_t) * nr * (size_t)t->stride);
  t->token_ids = malloc(sizeof(int32_t) * nr * (size_t)c->max_model_len);
  t->num_computed = malloc(sizeof(int32_t) * nr);
  t->num_scheduled = malloc(sizeof(int32_t) * nr);
  t->num_prompt = malloc(sizeof(int32_t) * nr);
  t->draft_tokens = malloc(sizeof(int32_t) * nr * (size_t)(c->num_spec_tokens + 1));
  t->draft_offsets = malloc(sizeof(int32_t) * (nr + 1));
  t->step_table = malloc(sizeof(int32_t) * nr * (size_t)t->stride);
  t->step_ids = malloc(sizeof(int32_t) * nr * (size_t)c->max_model_len);
  t->last_slot = malloc(sizeof(int32_t) * nr);
  t->last_tokens = malloc(sizeof(int32_t) * nr);
  if (!t->step_table || !t->step_ids || !t->last_slot || !t->last_tokens || !t->free_blocks || !t->reqs ||
      !t->block_table || !t->token_ids || !t->num_computed || !t->num_scheduled || !t->num_prompt || !t->draft_tokens ||
      !t->draft_offsets || t->shared_blocks >= c->num_blocks) {
    trace_destroy(t);
    return NULL;
  }
  /* free blocks in a shuffled order, so tables are not trivially sequential */
  for (int32_t i = t->shared_blocks; i < c->num_blocks; i++) t->free_blocks[t->num_free++] = i;
  perf_random_shuffle(t->free_blocks, t->num_free, &t->rng);
  return t;
}

void trace_destroy(trace *t) {
  if (!t) return;
  free(t->free_blocks);
  free(t->reqs);
  free(t->block_table);
  free(t->token_ids);
  free(t->num_computed);
  free(t->num_scheduled);
  free(t->num_prompt);
  free(t->draft_tokens);
  free(t->draft_offsets);
  free(t->step_table);
  free(t->step_ids);
  free(t->last_slot);
  free(t->last_tokens);
  free(t);
}

/* Admits a waiting request into slot num_reqs when its whole lifetime's blocks are free (reserved up
 * front, so no request is ever preempted). Returns 0 when it cannot. */
static int admit(trace *t) {
  const trace_config *c = &t->c;
  request r = {0};
  r.prompt_len = c->system_prompt_len + uniform(t, c->prompt_min, c->prompt_max);
  r.output_len = uniform(t, c->output_min, c->output_max);
  r.spec = (double)(perf_random_next(&t->rng) >> 11) * 0x1.0p-53 < c->spec_decode_share;
  const int32_t len = r.prompt_len + r.output_len + c->num_spec_tokens;
  const int32_t need = (len + c->block_size - 1) / c->block_size - t->shared_blocks;
  if (need > t->num_free) return 0;
  const int32_t slot = t->num_reqs++;
  int32_t *row = t->block_table + (size_t)slot * t->stride;
  for (int32_t i = 0; i < t->stride; i++) row[i] = -1;
  for (int32_t i = 0; i < t->shared_blocks; i++) row[i] = i;
  for (int32_t i = 0; i < need; i++) row[t->shared_blocks + i] = t->free_blocks[--t->num_free];
  /* the system prompt's ids are the same for everyone; the rest is random */
  int32_t *ids = t->token_ids + (size_t)slot * c->max_model_len;
  for (int32_t i = 0; i < r.prompt_len; i++) ids[i] = i < c->system_prompt_len ? (i * 7919) % 128000 : random_token(t);
  r.num_computed = t->shared_blocks * c->block_size; /* prefix-cache hit on the system prompt */
  t->reqs[slot] = r;
  return 1;
}

/* Frees a finished request's blocks and moves the last request into its slot (a condensed batch). */
static void retire(trace *t, int32_t slot) {
  const trace_config *c = &t->c;
  int32_t *row = t->block_table + (size_t)slot * t->stride;
  for (int32_t i = t->shared_blocks; i < t->stride && row[i] >= 0; i++) t->free_blocks[t->num_free++] = row[i];
  const int32_t last = --t->num_reqs;
  if (slot != last) {
    t->reqs[slot] = t->reqs[last];
    memcpy(row, t->block_table + (size_t)last * t->stride, sizeof(int32_t) * (size_t)t->stride);
    memcpy(t->token_ids + (size_t)slot * c->max_model_len, t->token_ids + (size_t)last * c->max_model_len,
           sizeof(int32_t) * (size_t)c->max_model_len);
  }
}

/* Applies the previous step's results: prompts advance by their chunk, decodes by what verification
 * accepted (at least the bonus token); finished requests leave. */
static void advance(trace *t, trace_step_mix *mix) {
  const trace_config *c = &t->c;
  for (int32_t b = 0; b < t->last_batch; b++) {
    request *r = &t->reqs[t->last_slot[b]];
    int32_t *ids = t->token_ids + (size_t)t->last_slot[b] * c->max_model_len;
    if (r->num_computed < r->prompt_len) {
      r->num_computed += t->last_tokens[b];
      if (r->num_computed == r->prompt_len) {
        ids[r->num_computed] = random_token(t);
        r->generated = 1;
      }
    } else {
      const int32_t accepted = uniform(t, 0, t->last_tokens[b] - 1) + 1;
      r->num_computed += accepted;
      r->generated += accepted;
      ids[r->num_computed] = random_token(t);
    }
  }
  t->last_batch = 0;
  for (int32_t s = t->num_reqs - 1; s >= 0; s--)
    if (t->reqs[s].generated >= t->reqs[s].output_len) {
      mix->finished++;
      retire(t, s);
    }
}

/* Adds slot s to the batch with ns real tokens (reported: what the scheduler's count says). */
static void add_to_batch(trace *t, uattn_step *step, int32_t s, int32_t ns, int32_t reported) {
  const trace_config *c = &t->c;
  const request *r = &t->reqs[s];
  const int32_t b = step->num_reqs++;
  t->num_computed[b] = r->num_computed;
  t->num_prompt[b] = r->prompt_len;
  t->num_scheduled[b] = reported;
  memcpy(t->step_table + (size_t)b * t->stride, t->block_table + (size_t)s * t->stride,
         sizeof(int32_t) * (size_t)t->stride);
  memcpy(t->step_ids + (size_t)b * c->max_model_len, t->token_ids + (size_t)s * c->max_model_len,
         sizeof(int32_t) * (size_t)(r->num_computed + ns));
  t->last_slot[b] = s;
  t->last_tokens[b] = ns;
  t->last_batch = b + 1;
}

int trace_next(trace *t, uattn_step *step, trace_step_mix *mix) {
  const trace_config *c = &t->c;
  memset(mix, 0, sizeof *mix);
  advance(t, mix);
  t->waiting += c->arrivals_per_step;
  while (t->waiting > 0 && t->num_reqs < c->max_num_seqs && admit(t)) t->waiting--;
  if (t->num_reqs == 0) return 0;

  memset(step, 0, sizeof *step);
  step->num_computed = t->num_computed;
  step->num_scheduled = t->num_scheduled;
  step->num_prompt = t->num_prompt;
  step->block_table = t->step_table;
  step->block_table_stride = t->stride;
  step->token_ids = t->step_ids;
  step->token_ids_stride = c->max_model_len;
  step->draft_tokens = t->draft_tokens;
  step->draft_offsets = t->draft_offsets;
  t->draft_offsets[0] = 0;

  /* decodes and verifications first, then prompt chunks in what the budget leaves (vLLM v1's order) */
  int32_t budget = c->max_num_batched_tokens, drafts = 0;
  for (int32_t s = 0; s < t->num_reqs && budget > 0; s++) {
    request *r = &t->reqs[s];
    if (r->num_computed < r->prompt_len) continue;
    int32_t real = 0;
    if (r->spec) {
      /* a random number of real drafts, the rest -1 placeholders (they do not count) */
      real = uniform(t, 1, c->num_spec_tokens);
      if (real + 1 > budget) real = budget - 1;
      int32_t *ids = t->token_ids + (size_t)s * c->max_model_len;
      for (int32_t i = 0; i < c->num_spec_tokens; i++) {
        const int32_t tok = i < real ? random_token(t) : -1;
        t->draft_tokens[drafts + i] = tok;
        if (tok >= 0) ids[r->num_computed + 1 + i] = tok;
      }
      drafts += c->num_spec_tokens;
      mix->spec_decodes++;
      mix->spec_tokens += real + 1;
    } else {
      mix->decodes++;
    }
    add_to_batch(t, step, s, real + 1, r->spec ? 1 + c->num_spec_tokens : 1);
    t->draft_offsets[step->num_reqs] = drafts;
    budget -= real + 1;
  }
  for (int32_t s = 0; s < t->num_reqs && budget > 0; s++) {
    request *r = &t->reqs[s];
    if (r->num_computed >= r->prompt_len) continue;
    const int32_t left = r->prompt_len - r->num_computed, ns = left < budget ? left : budget;
    add_to_batch(t, step, s, ns, ns);
    t->draft_offsets[step->num_reqs] = drafts;
    mix->prefills++;
    mix->prefill_tokens += ns;
    budget -= ns;
  }
  return 1;
}
