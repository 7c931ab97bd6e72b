/* Which kernels serve a layer (kernel_choice.h), and what served this thread's last forward. */
#include "attention/kernel_choice.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"

/* What the choice depends on besides the CPU: the layer's shape and the UATTN_ISA and UATTN_TWINS environment
 * variables, which are read on every call (one getenv: engines and tests may set it between calls) but asked about once.
 * Compared with memcmp, so always built from a zeroed key. */
typedef struct choice_key {
  int32_t block_size, head_dim, head_dim_v, chunk_size, group, num_kv_heads;
  bool kv_latent;
  uattn_dtype cache_dtype, dtype;
  uattn_kv_layout layout; /* which decode kernel reads the cache (the report's decode_kernel) */
  bool probs_fp32, twins;
  /* UATTN_ISA, "" when unset; a value this long names no set, and every such value chooses alike */
  char isa[24];
} choice_key;

/* The cache: entries [0, count) are complete and never change again, so a reader needs only count (acquire)
 * and no lock; writers append under the lock. A process sees a handful of shapes; past the capacity a shape
 * is chosen anew on each call. */
#define CHOICE_CAPACITY 64
static struct {
  choice_key key;
  uattn_kernel_choice choice;
} cache[CHOICE_CAPACITY];
static atomic_int cache_count;
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

/* The one place the forward's use of a set is decided (uattn_kernel_use). All-heads units need the decode
 * kernel, several KV heads to take at once, and no chunked merge of shared blocks, which the panels keep. */
static uattn_kernel_use kernel_use(const uattn_layer *L, int32_t block_size, const uattn_kernels *set) {
  const int32_t group = L->num_q_heads / L->num_kv_heads;
  const head_dims dims = layer_dims(L);
  const bool tiled = L->kv_layout == UATTN_LAYOUT_TILED && !dims.padded; /* staged rows are not tiles */
  uattn_kernel_use u = {.decode = uattn_decode_fits(set, block_size, dims.kernel, group), .staged = dims.padded};
  u.decode_tiled = tiled && uattn_decode_tiled_fits(set, block_size, dims.kernel, group, L->cache_dtype, L->probs_fp32);
  u.load_tiled = tiled && uattn_load_tiled_fits(set, L->cache_dtype);
  u.all_heads = u.decode && L->num_kv_heads > 1 && L->chunk_size == 0;
  return u;
}

static void choose(const uattn_layer *L, int32_t block_size, uattn_kernel_choice *c) {
  uattn_kernel_report *r = &c->report;
  memset(r, 0, sizeof *r);
  const int32_t head_dim = layer_dims(L).kernel;
  r->block_size = block_size;
  r->head_dim = head_dim;
  r->cache_dtype = L->cache_dtype;
  r->chunk_size = L->chunk_size;
  const uattn_bucket_kernels *bucket;
  c->set = uattn_kernels_dispatch(block_size, head_dim, L->cache_dtype, L->dtype, L->chunk_size, &bucket, r->reason,
                                  sizeof r->reason);
  r->bucket_hit = bucket != NULL;
  r->kernel_set = c->set->name;
  for (int p = 0; p < UATTN_NUM_PARTS; p++)
    snprintf(r->part_kernel[p], sizeof r->part_kernel[p], "%s", bucket ? bucket->part_names[p] : c->set->name);
  c->use = kernel_use(L, block_size, c->set);
  r->panels_gathered = (L->kv_layout == UATTN_LAYOUT_TILED && !c->use.load_tiled) || c->use.staged;
  /* a bucket's unique part is its decode kernel; on a TILED cache its decode_tiled, or (without one for the
   * layer) its decode on rows gathered from the tiles */
  if (!c->use.decode) return;
  const char *decode = bucket ? bucket->part_names[UATTN_PART_UNIQUE] : c->set->name;
  if (L->kv_layout != UATTN_LAYOUT_TILED && !c->use.staged)
    snprintf(r->decode_kernel, sizeof r->decode_kernel, "%s", decode);
  else if (c->use.decode_tiled)
    snprintf(r->decode_kernel, sizeof r->decode_kernel, "%s", bucket ? bucket->decode_tiled_name : c->set->name);
  else
    snprintf(r->decode_kernel, sizeof r->decode_kernel, "%s (gathered)", decode);
  if (bucket)
    snprintf(r->part_kernel[UATTN_PART_UNIQUE], sizeof r->part_kernel[UATTN_PART_UNIQUE], "%s", r->decode_kernel);
}

static const uattn_kernel_choice *find(const choice_key *key, int count) {
  for (int i = 0; i < count; i++)
    if (!memcmp(&cache[i].key, key, sizeof *key)) return &cache[i].choice;
  return NULL;
}

const uattn_kernel_choice *uattn_kernel_choice_for(const uattn_layer *L, int32_t block_size) {
  choice_key key;
  memset(&key, 0, sizeof key);
  key.block_size = block_size;
  key.head_dim = L->head_dim;
  key.head_dim_v = layer_dims(L).v;
  key.kv_latent = L->kv_latent;
  key.chunk_size = L->chunk_size;
  key.group = L->num_q_heads / L->num_kv_heads;
  key.num_kv_heads = L->num_kv_heads;
  key.cache_dtype = L->cache_dtype;
  key.dtype = L->dtype;
  key.layout = L->kv_layout;
  key.probs_fp32 = L->probs_fp32;
  const char *twins = getenv("UATTN_TWINS");
  key.twins = twins && *twins;
  const char *isa = getenv("UATTN_ISA");
  if (isa && strlen(isa) < sizeof key.isa)
    strcpy(key.isa, isa);
  else if (isa)
    memset(key.isa, 0xff, sizeof key.isa - 1); /* too long to be a set's name */

  const uattn_kernel_choice *hit = find(&key, atomic_load_explicit(&cache_count, memory_order_acquire));
  if (hit) return hit;
  pthread_mutex_lock(&cache_lock);
  const int count = atomic_load_explicit(&cache_count, memory_order_relaxed);
  hit = find(&key, count);
  if (!hit && count < CHOICE_CAPACITY) {
    cache[count].key = key;
    choose(L, block_size, &cache[count].choice);
    atomic_store_explicit(&cache_count, count + 1, memory_order_release);
    hit = &cache[count].choice;
  }
  pthread_mutex_unlock(&cache_lock);
  if (hit) return hit;
  static _Thread_local uattn_kernel_choice uncached; /* the cache is full */
  choose(L, block_size, &uncached);
  return &uncached;
}

static _Thread_local uattn_kernel_report last_report;
static _Thread_local bool have_last_report;

void uattn_kernel_report_keep(const uattn_kernel_report *r) {
  last_report = *r;
  have_last_report = true;
}

uattn_status uattn_last_forward_report(uattn_kernel_report *out) {
  uattn_clear_error();
  UATTN_CHECK_PTR(out, "out");
  if (!have_last_report)
    return uattn_fail(UATTN_ERR_INVALID_ARGUMENT,
                      "no uattn_forward has succeeded on this thread yet: the report is per calling thread");
  *out = last_report;
  return UATTN_OK;
}

/* The generic set alone (the tuning file's host key records it). */
const char *uattn_kernel_set(const char **why) { return uattn_kernels_select(why, NULL)->name; }
