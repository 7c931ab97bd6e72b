/* The generic amx set, in one of amx/tile.h's two forms: included by amx/set.c (the instructions) and
 * amx/twin.c (the emulation), each after deciding AMX_TILE_HW and AVX512_VEC_ZMM, with AMX_SET naming the set
 * and AMX_FN(name) naming its functions apart. Everything but the attend is avx512bf16/set.h's, instantiated
 * here in the same form (AMX_BASE: that set, under its own name). */
#include "amx/amx.h"
#include "amx/body.h"

#define BF16_SET AMX_BASE
#define BF16_FN(name) AMX_FN(bf16_##name)
#include "avx512bf16/set.h"

AMX_TARGET static void AMX_FN(attend)(const uattn_panel_job *job, int32_t panel_keys) {
  amx_attend_body(job, panel_keys, job->head_dim);
}

const uattn_kernels AMX_SET = {.name = "amx",
                               .load = BF16_FN(load),
                               .load_tiled = BF16_FN(load_tiled),
                               .attend = {AMX_FN(attend), AMX_FN(attend), AMX_FN(attend)},
                               .panel_floats = uattn_avx512bf16_panel_floats,
                               .decode = BF16_FN(decode),
                               .decode_tiled = BF16_FN(decode_tiled),
                               .caps = UATTN_CAPS_RECORD(AMX_CAPS)};
