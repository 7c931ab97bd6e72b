/* Choosing the kernel set for this CPU, once per process. */
#include <stdlib.h>
#include <string.h>

#include "avx2.h"
#include "kernels.h"

/* The sets, best first; a set's probe says whether this CPU runs it (NULL: always). The portable set is
 * last and always runs. */
typedef struct candidate {
  const uattn_kernels *set;
  int (*runs_here)(void);
} candidate;

static const candidate candidates[] = {
    {&uattn_kernels_avx2, uattn_avx2_runs_here},
    {&uattn_kernels_portable, NULL},
};

const uattn_kernels *uattn_kernels_select(const char **why) {
  const size_t n = sizeof candidates / sizeof *candidates;
  const uattn_kernels *best = NULL;
  for (size_t i = 0; i < n && !best; i++)
    if (!candidates[i].runs_here || candidates[i].runs_here()) best = candidates[i].set;
  if (why) *why = "the best set this CPU runs";
  const char *forced = getenv("UATTN_ISA");
  if (!forced || !*forced) return best;
  for (size_t i = 0; i < n; i++)
    if (!strcmp(candidates[i].set->name, forced)) {
      if (candidates[i].runs_here && !candidates[i].runs_here()) {
        if (why) *why = "UATTN_ISA names a set this CPU cannot run: using the best one it runs";
        return best;
      }
      if (why) *why = "forced by UATTN_ISA";
      return candidates[i].set;
    }
  if (why) *why = "UATTN_ISA names no kernel set: using the best one this CPU runs";
  return best;
}
