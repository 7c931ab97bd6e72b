/* One generated bucket of the avx512bf16fma set: an entry of other buckets' functions, compiled nowhere here. Its
 * source (gen/generate.py) names the avx512 bucket's load, load_tiled and attend functions of the same shape
 * (the manifest's "shares") and the avx512bf16 bucket's decode kernels ("decodes"); bucket_entry.h declares
 * them, under the same conditions on the shape as those buckets define them (this set's record is avx512bf16's
 * for the decode kernels), and writes the entry. */
#include "avx512bf16fma/avx512bf16fma.h"

#define BUCKET_ISA "avx512bf16fma"
#define BUCKET_GENERIC uattn_kernels_avx512bf16fma
#define BUCKET_RUNS_HERE uattn_avx512bf16fma_runs_here
#define BUCKET_PANEL_FLOATS uattn_avx2_panel_floats
#define BUCKET_CAPS AVX512BF16FMA_CAPS
#define BUCKET_HAS_LOAD_TILED
#define BUCKET_HAS_DECODE_TILED
#include "bucket_entry.h"
