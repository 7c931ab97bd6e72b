/* A job that keeps fewer dims of o than its head dim (uattn_panel_job.value_dim: an MLA layer's values are
 * shorter than its keys) gets, from every set's attend, the bits of the same job keeping them all: each set
 * through its twin wherever AVX2 runs, and itself where the CPU runs it. The other suites' random jobs keep
 * fewer dims a quarter of the time, so their checks against the portable set and between twins cover it too. */
#include <criterion/criterion.h>

#include "amx/amx.h"
#include "avx2/avx2.h"
#include "avx512/avx512.h"
#include "avx512bf16/avx512bf16.h"
#include "jobs.h"

typedef struct value_dim_set {
  const uattn_kernels *set;
  int (*runs_here)(void);
  bool bf16;
  int sparse; /* the amx twin's tile products are emulated element by element: fewer jobs */
} value_dim_set;

Test(kernels, every_attend_keeps_its_bits_with_fewer_value_dims, .timeout = 300) {
  need_avx2();
  const value_dim_set sets[] = {
      {&uattn_kernels_avx2, uattn_avx2_runs_here, false, 1},
      {&uattn_kernels_avx512_twin, uattn_avx2_runs_here, false, 1},
      {&uattn_kernels_avx512, uattn_avx512_runs_here, false, 1},
      {&uattn_kernels_avx512bf16_twin, uattn_avx2_runs_here, true, 1},
      {&uattn_kernels_avx512bf16, uattn_avx512bf16_runs_here, true, 1},
      {&uattn_kernels_amx_twin, uattn_avx2_runs_here, true, 4},
      {&uattn_kernels_amx, uattn_amx_runs_here, true, 1},
  };
  for (size_t k = 0; k < sizeof sets / sizeof *sets; k++) {
    const value_dim_set *s = &sets[k];
    if (!s->runs_here()) continue;
    const case_limits any = {.bf16 = s->bf16}, large = {.large = true, .bf16 = s->bf16};
    check_value_dim_is_a_prefix(s->set, UATTN_PART_SHARED, &any, 400 / SPARSE / s->sparse, 20261206 + k, s->set->name);
    check_value_dim_is_a_prefix(s->set, UATTN_PART_CAUSAL, &large, 100 / SPARSE / s->sparse, 20261216 + k,
                                s->set->name);
  }
}
