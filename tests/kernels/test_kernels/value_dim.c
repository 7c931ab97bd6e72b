/* A job that keeps fewer dims of o than its head dim (uattn_panel_job.value_dim: an MLA layer's values are
 * shorter than its keys) gets, from every set's attend, the bits of the same job keeping them all: each rung of
 * the ISA ladder (uattn_isa_registry) where the CPU runs it, and its twin wherever that runs. The other suites'
 * random jobs keep fewer dims a quarter of the time, so their checks against the portable set and between
 * twins cover it too. */
#include <criterion/criterion.h>

#include "amx/amx.h"
#include "jobs.h"

static void check_set(const uattn_kernels *set, uint64_t seed) {
  const bool bf16 = set->caps.bf16_inputs;
  /* the amx twin's tile products are emulated element by element: fewer jobs */
  const int sparse = set == &uattn_kernels_amx_twin ? 4 : 1;
  const case_limits any = {.bf16 = bf16}, large = {.large = true, .bf16 = bf16};
  check_value_dim_is_a_prefix(set, UATTN_PART_SHARED, &any, 400 / SPARSE / sparse, seed, set->name);
  check_value_dim_is_a_prefix(set, UATTN_PART_CAUSAL, &large, 100 / SPARSE / sparse, seed + 10, set->name);
}

Test(kernels, every_attend_keeps_its_bits_with_fewer_value_dims, .timeout = KERNEL_TEST_TIMEOUT) {
  need_avx2();
  for (size_t i = 0; i < uattn_isa_registry_size; i++) {
    const uattn_isa *isa = &uattn_isa_registry[i];
    if (!isa->runs_here || isa->runs_here()) check_set(isa->set, 20261206 + i);
    if (isa->twin && isa->twin_runs_here()) check_set(isa->twin, 20261226 + i);
  }
}
