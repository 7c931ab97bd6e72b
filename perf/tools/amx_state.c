/* A preload library for timing with and without AMX on a Linux host that has it: Linux hands a process the AMX
 * tile state only when the process asks (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA).
 *   UATTN_AMX_STATE=grant  asks for it as the process starts: what vLLM's standalone CPU attention driver needs
 *                          for its amx path (vLLM's worker asks through torch), else it dies of an illegal
 *                          instruction (perf/tools/vs_vllm.py --isa amx);
 *   UATTN_AMX_STATE=deny   refuses every such request, so uattn's amx probe says no and the dispatch takes what an
 *                          Intel core without AMX takes (the avx512bf16fma level and its buckets).
 * LD_PRELOAD=build/perf/libuattn-amx-state.so UATTN_AMX_STATE=deny build/perf/uattn-bench ... */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

enum { REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };

static int mode_is(const char *want) {
  const char *m = getenv("UATTN_AMX_STATE");
  return m && !strcmp(m, want);
}

__attribute__((constructor)) static void grant_at_start(void) {
  if (mode_is("grant")) syscall(SYS_arch_prctl, REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
}

/* uattn asks through libc's syscall(); with deny this one answers EPERM for the request and passes the rest on
 * (exported: the build hides symbols by default, and a hidden one would not stand in for libc's). */
__attribute__((visibility("default"))) long syscall(long number, ...) {
  va_list ap;
  va_start(ap, number);
  long a[6];
  for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long);
  va_end(ap);
  if (number == SYS_arch_prctl && a[0] == REQ_XCOMP_PERM && mode_is("deny")) {
    errno = EPERM;
    return -1;
  }
  static long (*next)(long, ...);
  if (!next) next = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
  return next(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}
