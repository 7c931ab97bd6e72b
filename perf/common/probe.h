/* The loops that measure a core's limits, shared by uattn-bench (bench/limits.c: its machine lines),
 * uattn-kernel-bench (its FMA peak, the plain read its decode walks are held to) and uattn-experiments: fp32
 * FMAs, bf16 pair products (vdpbf16ps), AMX bf16 tile products (tdpbf16ps) and streaming reads. Each loop runs on the calling thread; timing and threads are the caller's.
 * tests/tools/probe_loops.py reads this object's disassembly: each loop must keep its CHAINS accumulators in
 * registers, independent of each other, or it measures the compiler instead of the core. */
#ifndef UATTN_PERF_PROBE_H
#define UATTN_PERF_PROBE_H

#include <stddef.h>

/* Independent accumulator chains a step of each loop advances: enough to cover latency x issue rate on any
 * core these probes meet (fp32 FMA: 4 cycles x 2 ports; vdpbf16ps: 6-8 cycles at one or two a cycle). */
#define BENCH_PROBE_FMA_CHAINS 12
#define BENCH_PROBE_BF16_CHAINS 12
/* AMX: a 2 x 2 block of accumulator tiles over two A and two B tiles, as a GEMM's inner loop holds them (the
 * eight tile registers: four accumulators, four operands). */
#define BENCH_PROBE_AMX_CHAINS 4
#define BENCH_PROBE_READ_CHAINS 4

/* Flops one step of a loop does (a multiply and an add count two, as for an FMA peak). */
#define BENCH_PROBE_FMA_FLOPS(lanes) (BENCH_PROBE_FMA_CHAINS * 2.0 * (lanes))
#define BENCH_PROBE_BF16_FLOPS (BENCH_PROBE_BF16_CHAINS * 16 * 4.0)         /* zmm: 16 lanes, 2 products and 2 adds */
#define BENCH_PROBE_AMX_FLOPS (BENCH_PROBE_AMX_CHAINS * 16 * 16 * 32 * 2.0) /* 16 x 16 outputs, 32 pairs deep */

/* The widest fp32 FMA this CPU and its OS run: 16 lanes (AVX-512F), 8 (AVX2 and FMA), or 1 (scalar C). */
int bench_probe_fma_lanes(void);
/* `iters` steps of fp32 FMAs on `lanes` lanes (16, 8 or 1, each only where bench_probe_fma_lanes() reaches it);
 * returns a sum of the accumulators, for the caller to keep. */
double bench_probe_fma(long iters, int lanes);

/* 1 when this CPU and its OS run AVX512-BF16 on zmm (and this compiler builds it). */
int bench_probe_has_bf16_dot(void);
/* `iters` steps of vdpbf16ps zmm; 0 without running anything where bench_probe_has_bf16_dot() is 0. */
double bench_probe_bf16_dot(long iters);

/* 1 when this CPU has AMX-TILE and AMX-BF16 and the OS has granted this process the tile state (Linux asks per
 * process: arch_prctl ARCH_REQ_XCOMP_PERM, which this call makes once); else 0, and the AMX loop never runs. */
int bench_probe_has_amx(void);
/* `iters` steps of tdpbf16ps on the calling thread (it configures and releases its own tiles); 0 without
 * running anything where bench_probe_has_amx() is 0. */
double bench_probe_amx(long iters);

/* The sum of x[0, n) read once front to back (n a multiple of 32, x 32-byte aligned): a streaming read. */
double bench_probe_read(const float *x, size_t n);

/* The n bytes at p (a multiple of 128) read once front to back and summed as 16-bit words into sink, no float
 * ever seeing them (a cache's bits would be NaNs and denormals to a float add): the plain read a kernel's walk
 * over the same bytes is held to. x86 CPUs with AVX2 only (the caller checks: no test a call, calls are short). */
void bench_probe_read_words(const char *p, size_t n, float sink[8]);

#endif
