/* uattn-sweep's options: the usage text and the parsing of the command line into the buckets, the tunables'
 * candidates and the workload's shape; apart from sweep.c because none of it times anything. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "convert.h"
#include "sweep/options.h"
#include "uattn_tuning.h"

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: uattn-sweep [options]\n"
      "\n"
      "Times a workload under each value of uattn's tunables, per kernel bucket, and writes into DIR (-o):\n"
      "  tuning.json   the best values per bucket: load it with UATTN_TUNING_FILE=DIR/tuning.json or\n"
      "                uattn_runtime_load_tuning(); it is refused on another CPU, kernel set or uattn version\n"
      "  sweep.json    every measurement, and the batch-bucket padding report\n"
      "  sweep.png     time against each tunable, relative to that tunable at its default (needs gnuplot)\n"
      "  trace.json    the workload, as a trace file (--trace replays it)\n"
      "\n"
      "The tunables, each swept with the others at their best so far (in this order), a value kept only when it\n"
      "is at least --min-gain faster; the winner is then timed against the defaults and kept only when it is\n"
      "--min-gain faster there too:\n"
      "  threads      workers of the runtime (uattn_runtime_config.num_threads; default 0: all, one per core)\n"
      "  query_tile   query rows per tile (uattn_layer.causal_width; default 0: 64 a KV head, at most 512)\n"
      "  chunk_size   shared blocks per online-merge chunk (uattn_layer.chunk_size; default 0: whole)\n"
      "  split        split-K for long decodes, split_min_keys/split_keys (uattn_plan_config; default 0:\n"
      "               8192/4096)\n"
      "A configuration's time is the median of --runs passes over the workload (one forward call per step);\n"
      "the passes of the configurations compared are interleaved, so a change of the machine's load hits\n"
      "them alike.\n"
      "\n"
      "options:\n"
      "  -o DIR              output folder (default uattn-sweep; created)\n"
      "  --bucket BS:HD:DT   a kernel bucket: block size, head dim, cache dtype f32|bf16|f16|fp8_e4m3|fp8_e5m2\n"
      "                      (q, k, v in bf16 for fp8; repeat it; default 16:128:bf16 and 128:128:bf16)\n"
      "  --heads HQ:HKV      query and KV heads (default 32:8)\n"
      "  --runs N            timed passes per configuration, median (default 3; twice that head to head)\n"
      "  --min-gain F        keep a value only when it is F faster than the best so far (default 0.03)\n"
      "  --threads LIST      thread counts to try, e.g. 1,2,4 (default: 1 and powers of two below the cores)\n"
      "  --tiles LIST        query tiles (default 64,128,256)\n"
      "  --chunks LIST       chunk sizes in blocks (default 1,4,16)\n"
      "  --splits LIST       split-K as MIN/KEYS pairs (default 2048/1024,1024/512,512/256)\n"
      "  --trace FILE        replay a trace file instead of generating a workload\n"
      "  --steps N           generated: steps timed (default 10), every --stride-th (4) of the serving\n"
      "                      simulator's (perf/common/trace.h) after the first --skip (4): from the ramp-up's prompts\n"
      "                      to decodes over longer contexts\n"
      "  --seqs N, --tokens N, --max-len N, --prefix N\n"
      "                      generated: sequences and tokens per step (32, 128), longest sequence (2048; prompts\n"
      "                      of up to 1/8 of it, outputs of up to 1/4), system prompt shared by every request (256)\n"
      "  --seed N            generated: the simulator's seed (42)\n"
      "  --no-plot           do not run gnuplot\n"
      "  -h, --help          this text\n"
      "\n"
      "A trace file (JSON) lists steps in tokens, whatever the block size; blocks are laid out per bucket:\n"
      "  {\"shared_prefix\": 256,             tokens at the start of every request, cached once (optional)\n"
      "   \"max_num_seqs\": 16, \"max_num_batched_tokens\": 256, \"max_model_len\": 2048,   (optional)\n"
      "   \"steps\": [\n"
      "     [{\"computed\": 256, \"scheduled\": 200, \"prompt\": 456},          a prompt chunk\n"
      "      {\"computed\": 700, \"scheduled\": 1, \"prompt\": 500},            a decode\n"
      "      {\"computed\": 650, \"scheduled\": 4, \"prompt\": 500, \"drafts\": 3}],   verification of 3 drafts\n"
      "     ...]}\n"
      "  computed: tokens in the cache before the step; scheduled: new tokens (drafts + 1 when verifying);\n"
      "  prompt: the request's prompt length. Unknown keys are errors.\n"
      "\n"
      "Exit status: 0, 1 when a step fails, 2 on bad options or a bad trace file.\n");
}

static int bad_option(const char *what, const char *value) {
  fprintf(stderr, "uattn-sweep: %s: bad value \"%s\" (see --help)\n", what, value ? value : "(missing)");
  return -1;
}

static int parse_count(const char *s, int32_t lo, int32_t *out) {
  char *end;
  errno = 0;
  const long v = s ? strtol(s, &end, 10) : 0;
  if (!s || end == s || *end || errno || v < lo || v > 1 << 30) return -1;
  *out = (int32_t)v;
  return 0;
}

static int parse_bucket(const char *s, bucket *b) {
  char dt[16];
  if (!s || sscanf(s, "%d:%d:%15s", &b->block_size, &b->head_dim, dt) != 3 || b->block_size < 1 || b->head_dim < 1 ||
      b->block_size > UATTN_TUNING_MAX_BLOCK_SIZE || b->head_dim > UATTN_TUNING_MAX_HEAD_DIM)
    return -1;
  return uattn_dtype_parse(dt, false, &b->dtype) ? 0 : -1;
}

/* "a,b,c" after the default 0 (split: "min/keys,..."). */
static int parse_list(const char *s, options *o, int t) {
  o->num_cand[t] = 1;
  o->cand[t][0] = 0;
  o->split_min[0] = o->split_keys[0] = 0;
  const char *p = s;
  while (p && *p) {
    if (o->num_cand[t] == MAX_CANDIDATES) return -1;
    char *end;
    const int n = o->num_cand[t];
    const long a = strtol(p, &end, 10);
    if (end == p || a < 1 || a > INT32_MAX) return -1;
    o->cand[t][n] = n;
    if (t == T_SPLIT) {
      if (*end != '/') return -1;
      p = end + 1;
      const long b = strtol(p, &end, 10);
      if (end == p || b < 1 || b > INT32_MAX) return -1;
      o->split_min[n] = (int32_t)a;
      o->split_keys[n] = (int32_t)b;
    } else {
      o->cand[t][n] = (int32_t)a;
    }
    o->num_cand[t]++;
    if (*end == ',')
      end++;
    else if (*end)
      return -1;
    p = end;
  }
  return s ? 0 : -1;
}

int sweep_parse_options(int argc, char **argv, options *o) {
  memset(o, 0, sizeof *o);
  o->out_dir = "uattn-sweep";
  o->hq = 32, o->hkv = 8, o->runs = 3, o->steps = 10, o->skip = 4, o->stride = 4, o->seqs = 32, o->tokens = 128;
  o->max_len = 2048, o->prefix = 256, o->seed = 42, o->min_gain = 0.03, o->plot = true;
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  char threads[128] = "1";
  for (long c = 2; c < cores && c <= 1 << 20; c *= 2) {
    const size_t used = strlen(threads);
    snprintf(threads + used, sizeof threads - used, ",%ld", c);
  }
  if (cores <= 1) threads[0] = '\0';
  parse_list(threads, o, T_THREADS);
  parse_list("64,128,256", o, T_TILE);
  parse_list("1,4,16", o, T_CHUNK);
  parse_list("2048/1024,1024/512,512/256", o, T_SPLIT);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int32_t *count = !strcmp(a, "--runs")      ? &o->runs
                     : !strcmp(a, "--steps")   ? &o->steps
                     : !strcmp(a, "--skip")    ? &o->skip
                     : !strcmp(a, "--stride")  ? &o->stride
                     : !strcmp(a, "--seqs")    ? &o->seqs
                     : !strcmp(a, "--tokens")  ? &o->tokens
                     : !strcmp(a, "--max-len") ? &o->max_len
                     : !strcmp(a, "--prefix")  ? &o->prefix
                                               : NULL;
    const int list = !strcmp(a, "--threads")  ? T_THREADS
                     : !strcmp(a, "--tiles")  ? T_TILE
                     : !strcmp(a, "--chunks") ? T_CHUNK
                     : !strcmp(a, "--splits") ? T_SPLIT
                                              : -1;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      exit(0);
    } else if (count) {
      const int32_t lo = count == &o->skip || count == &o->prefix ? 0 : 1;
      if (parse_count(v, lo, count)) return bad_option(a, v);
      i++;
    } else if (list >= 0) {
      if (parse_list(v, o, list)) return bad_option(a, v);
      i++;
    } else if (!strcmp(a, "-o") && v) {
      o->out_dir = argv[++i];
    } else if (!strcmp(a, "--trace") && v) {
      o->trace_file = argv[++i];
    } else if (!strcmp(a, "--bucket")) {
      if (o->num_buckets == MAX_BUCKETS || parse_bucket(v, &o->buckets[o->num_buckets])) return bad_option(a, v);
      o->num_buckets++;
      i++;
    } else if (!strcmp(a, "--heads")) {
      if (!v || sscanf(v, "%d:%d", &o->hq, &o->hkv) != 2 || o->hq < 1 || o->hkv < 1 || o->hq % o->hkv)
        return bad_option(a, v);
      i++;
    } else if (!strcmp(a, "--min-gain")) {
      char *end;
      o->min_gain = v ? strtod(v, &end) : -1;
      if (!v || *end || !(o->min_gain >= 0 && o->min_gain < 1)) return bad_option(a, v);
      i++;
    } else if (!strcmp(a, "--seed")) {
      int32_t s;
      if (parse_count(v, 0, &s)) return bad_option(a, v);
      o->seed = (uint64_t)s;
      i++;
    } else if (!strcmp(a, "--no-plot")) {
      o->plot = false;
    } else {
      fprintf(stderr, "uattn-sweep: unknown option %s (see --help)\n", a);
      return -1;
    }
  }
  if (o->num_buckets == 0) {
    o->buckets[0] = (bucket){16, 128, UATTN_BF16};
    o->buckets[1] = (bucket){128, 128, UATTN_BF16};
    o->num_buckets = 2;
  }
  return 0;
}
