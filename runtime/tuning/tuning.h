/* Tuning files inside the library (runtime/tuning/tuning.c): the table a runtime holds, its hooks in the runtime's
 * creation and destruction, and the lookup the forward pass applies. The file format and the public calls
 * are described in include/uattn.h (the tuning section).
 *
 * For the forward pass (runtime/attention/forward.c), per call, with rt non-NULL:
 *
 *   const uattn_tuning_entry *e = uattn_tuning_find(rt, t->block_size, L->head_dim, L->cache_dtype);
 *   if (e) {
 *     causal width / query tile = L->causal_width ? L->causal_width : (e->query_tile ? e->query_tile : 512);
 *     chunk size                = L->chunk_size   ? L->chunk_size   : e->chunk_size;
 *     workers to hand units to  = e->num_threads ? min(e->num_threads, workers) : workers;
 *   }
 *
 * The layer's explicit values win; 0 in the entry means the library's default. split_min_keys and
 * split_keys belong to the plan (uattn_plan_config), which is created before the layer is known: an engine
 * applies them with uattn_runtime_tuned_plan_config(); the forward cannot change a plan. */
#ifndef UATTN_RUNTIME_TUNING_H
#define UATTN_RUNTIME_TUNING_H

#include "common/internal.h"
#include "uattn_tuning.h"

typedef struct uattn_tuning_state uattn_tuning_state;

/* Creates rt->tuning and, when $UATTN_TUNING_FILE is set and not empty, loads that file. A refused file
 * does not fail: the runtime keeps the defaults and the report says why (uattn.h). Fails only when out of
 * memory. Called by uattn_runtime_create once rt->alloc is set. */
uattn_status uattn_tuning_runtime_init(uattn_runtime *rt);
/* Frees rt->tuning (NULL-safe). Called by the runtime's destruction. */
void uattn_tuning_runtime_release(uattn_runtime *rt);

/* The entry for a kernel bucket in the tuning rt has loaded, or NULL: no runtime, no file loaded, or no
 * entry for that bucket. Lock-free (one atomic load and a short scan) and safe while another thread loads
 * a file: the pointer stays valid until uattn_runtime_destroy. Each call counts as one use of the entry
 * (or, when none matches, of the bucket's defaults), which uattn_runtime_tuning_report lists: call it
 * once per forward call that applies it. Sets no error message. */
const uattn_tuning_entry *uattn_tuning_find(const uattn_runtime *rt, int32_t block_size, int32_t head_dim,
                                            uattn_dtype cache_dtype);

#endif /* UATTN_TUNING_H */
