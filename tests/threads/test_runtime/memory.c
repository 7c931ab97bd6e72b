/* Memory: the runtime's per-worker scratch (aligned, kept and grown; per thread without a runtime), and the KV
 * cache memory (runtime/threads/cache_memory.c): aligned, zeroed, asking for huge pages, interleaved over the
 * runtime's nodes, and refusing bad requests. */
#define _GNU_SOURCE /* sched_getcpu, CPU_SET, setenv */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#endif

#include "runtime.h"

/* ---- scratch ---------------------------------------------------------------------------------------------- */

typedef struct scratch_ctx {
  uattn_runtime *rt;
  size_t bytes;
  int phase; /* 0: fill, 1: check, 2: check pointer only */
  unsigned char *ptr[MAXW];
  _Atomic int32_t errors;
} scratch_ctx;

static void scratch_job(void *p, int32_t w, int32_t n) {
  scratch_ctx *c = p;
  unsigned char *s = uattn_worker_scratch(c->rt, w, c->bytes);
  if (!s || (uintptr_t)s % 64 != 0) {
    atomic_fetch_add(&c->errors, 1);
    return;
  }
  if (c->phase == 0) {
    memset(s, w + 1, c->bytes);
    c->ptr[w] = s;
  } else {
    if (s != c->ptr[w]) atomic_fetch_add(&c->errors, 1);
    if (c->phase == 1)
      for (size_t i = 0; i < c->bytes; i++)
        if (s[i] != (unsigned char)(w + 1)) {
          atomic_fetch_add(&c->errors, 1);
          break;
        }
  }
}

Test(runtime, scratch_is_per_worker_aligned_kept_and_grown) {
  uattn_allocator hooks = {ts_alloc, ts_free, NULL};
  uattn_runtime_config c = uattn_runtime_config_default();
  c.num_threads = 3;
  c.allocator = &hooks;
  uattn_runtime *rt = create(&c);
  long allocs_at_create = atomic_load(&ts_allocs);
  cr_assert(allocs_at_create >= 1, "the runtime's own memory goes through the allocator");

  scratch_ctx sc = {.rt = rt, .bytes = 4096, .phase = 0};
  uattn_runtime_run(rt, scratch_job, &sc);
  cr_assert_eq(sc.errors, 0);
  for (int w = 0; w < 3; w++)
    for (int v = 0; v < w; v++) cr_assert_neq(sc.ptr[v], sc.ptr[w], "workers %d and %d share scratch", v, w);
  long allocs = atomic_load(&ts_allocs);
  cr_assert_eq(allocs - allocs_at_create, 3, "one scratch allocation per worker");

  for (int w = 0; w < 3; w++) { /* what each worker holds, as a caller holding rt sees it */
    cr_assert(uattn_worker_scratch_fits(rt, w, 4096) && uattn_worker_scratch_fits(rt, w, 1));
    cr_assert_not(uattn_worker_scratch_fits(rt, w, 4097), "worker %d: 4096 bytes reserved, not more", w);
  }
  cr_assert_not(uattn_worker_scratch_fits(rt, 3, 1), "worker out of range");
  cr_assert_not(uattn_worker_scratch_fits(rt, -1, 1));

  sc.phase = 1; /* same size, then smaller: same memory, contents kept, nothing allocated */
  for (int i = 0; i < 20; i++) uattn_runtime_run(rt, scratch_job, &sc);
  sc.bytes = 100;
  uattn_runtime_run(rt, scratch_job, &sc);
  cr_assert_eq(sc.errors, 0, "scratch moved or lost its contents between calls");
  cr_assert_eq(atomic_load(&ts_allocs), allocs);

  sc.bytes = 3 << 20; /* grows: aligned and usable (contents not kept) */
  sc.phase = 0;
  uattn_runtime_run(rt, scratch_job, &sc);
  sc.phase = 1;
  uattn_runtime_run(rt, scratch_job, &sc);
  cr_assert_eq(sc.errors, 0);
  cr_assert_eq(atomic_load(&ts_allocs), allocs + 3);
  for (int w = 0; w < 3; w++) cr_assert(uattn_worker_scratch_fits(rt, w, (size_t)3 << 20));

  cr_assert_null(uattn_worker_scratch(rt, 3, 64), "worker out of range");
  cr_assert_null(uattn_worker_scratch(rt, -1, 64));
  uattn_runtime_destroy(rt);
  cr_assert_eq(atomic_load(&ts_allocs), atomic_load(&ts_frees), "the runtime freed what it allocated");
  CHECK_NO_LEAKS();
}

static void *null_rt_scratch_thread(void *arg) {
  unsigned char *p = uattn_worker_scratch(NULL, 0, 1000);
  if (!p || (uintptr_t)p % 64) return NULL;
  memset(p, 7, 1000);
  unsigned char *q = uattn_worker_scratch(NULL, 0, 500);
  if (q != p || q[999] != 7) return NULL;
  *(unsigned char **)arg = p;
  return arg;
}

Test(runtime, scratch_without_runtime_is_per_thread) {
  unsigned char *mine = uattn_worker_scratch(NULL, 0, 0);
  cr_assert_not_null(mine, "0 bytes still gives a pointer");
  cr_assert_eq((uintptr_t)mine % 64, 0);
  mine = uattn_worker_scratch(NULL, 0, 1000);
  memset(mine, 1, 1000);
  unsigned char *theirs = NULL;
  pthread_t th;
  void *res;
  pthread_create(&th, NULL, null_rt_scratch_thread, &theirs);
  pthread_join(th, &res);
  cr_assert_not_null(res, "a thread's scratch was not aligned, kept or sized");
  cr_assert_neq(theirs, mine);
  cr_assert_eq(mine[999], 1, "another thread's scratch overwrote this one's");
  cr_assert(uattn_worker_scratch_fits(NULL, 0, 1000), "rt NULL: this thread's own buffer");
  cr_assert_not(uattn_worker_scratch_fits(NULL, 0, 1 << 20));
  unsigned char *big = uattn_worker_scratch(NULL, 0, 1 << 20);
  cr_assert(big && (uintptr_t)big % 64 == 0);
  big[(1 << 20) - 1] = 1;
  CHECK_NO_LEAKS(); /* the other thread's buffer was freed at its exit; this thread's is still reachable */
}

/* ---- KV cache memory (runtime/threads/cache_memory.c) ----------------------------------------------------------- */

TestSuite(cache_memory);

/* The THPeligible field of the /proc/self/smaps entry that holds p: 1 or 0, -1 where the kernel does not
 * report it. */
static int thp_eligible(const void *p) {
  FILE *f = fopen("/proc/self/smaps", "r");
  if (!f) return -1;
  char line[256];
  int in = 0, v = -1;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
      in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
    else if (in && sscanf(line, "THPeligible: %d", &v) == 1)
      break;
  }
  fclose(f);
  return v;
}

/* Whether /sys says transparent huge pages may be given to a madvise'd range ("always" or "madvise"). */
static bool thp_on_request(void) {
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  char s[128] = "";
  if (f) {
    if (!fgets(s, sizeof s, f)) s[0] = '\0';
    fclose(f);
  }
  return strstr(s, "[always]") || strstr(s, "[madvise]");
}

/* What either allocator gives, `rounded` bytes (its whole 2 MiB pages) at p: 2 MiB-aligned, zeroed, every
 * byte writable, and marked for huge pages where the system's THP setting allows. */
static void check_cache_memory(void *p, size_t rounded) {
  cr_assert_eq((uintptr_t)p % (2u << 20), 0, "%p is not 2 MiB-aligned", p);
  unsigned char *b = p;
  for (size_t i = 0; i < rounded; i += 4096) cr_assert_eq(b[i], 0, "byte %zu is not zero", i);
  for (size_t i = 0; i < rounded; i++) b[i] = (unsigned char)(i * 7); /* the whole rounded range is ours */
  for (size_t i = 0; i < rounded; i += 997) cr_assert_eq(b[i], (unsigned char)(i * 7));
  const int eligible = thp_eligible(p);
  if (eligible >= 0 && thp_on_request()) cr_assert_eq(eligible, 1, "the cache was not marked for huge pages");
}

Test(cache_memory, is_aligned_zeroed_writable_and_asks_for_huge_pages) {
  const size_t bytes = (3u << 20) + 5; /* rounds up to two 2 MiB pages */
  void *p = (void *)1;
  cr_assert_eq(uattn_cache_alloc(bytes, &p), UATTN_OK, "%s", uattn_last_error());
  check_cache_memory(p, 4u << 20);
  uattn_cache_free(p, bytes);
  uattn_cache_free(NULL, bytes);
}

/* The memory policy /proc/self/numa_maps gives the mapping that holds p ("interleave:0-1", "default"), in
 * out; false where the kernel keeps no such file (no NUMA support built in). */
static bool numa_policy(const void *p, char *out, size_t n) {
  FILE *f = fopen("/proc/self/numa_maps", "r");
  if (!f) return false;
  char line[512], policy[128];
  unsigned long best = 0;
  out[0] = '\0';
  while (fgets(line, sizeof line, f)) { /* the mapping with the highest start at or below p */
    unsigned long start;
    if (sscanf(line, "%lx %127s", &start, policy) == 2 && start <= (uintptr_t)p && start >= best) {
      best = start;
      snprintf(out, n, "%s", policy);
    }
  }
  fclose(f);
  return out[0] != '\0';
}

Test(cache_memory, runtime_cache_interleaves_pages_over_its_nodes) {
  uattn_runtime *rt = create(NULL);
  const uattn_topology topo = topology(rt);
  const size_t bytes = (5u << 20) + 3; /* three 2 MiB pages */
  void *p = (void *)1;
  cr_assert_eq(uattn_runtime_cache_alloc(rt, bytes, &p), UATTN_OK, "%s", uattn_last_error());
  check_cache_memory(p, 6u << 20);
  char policy[128];
  if (numa_policy(p, policy, sizeof policy)) {
    /* the nodes of the runtime's workers: one node spelled out, several at least named as interleaved */
    int32_t node = -1;
    bool one = true;
    for (int32_t w = 0; w < topo.num_workers && w < UATTN_TOPOLOGY_MAX_WORKERS; w++) {
      if (topo.worker_numa[w] < 0) continue;
      if (node >= 0 && topo.worker_numa[w] != node) one = false;
      node = topo.worker_numa[w];
    }
    char want[32] = "interleave:";
    if (one && node >= 0) snprintf(want, sizeof want, "interleave:%d", (int)node);
    cr_assert(one && node >= 0 ? !strcmp(policy, want) : !strncmp(policy, want, strlen(want)),
              "numa_maps gives \"%s\" for the cache, not \"%s\"", policy, want);
  }
  uattn_cache_free(p, bytes);
  uattn_runtime_destroy(rt);
}

#if defined(__x86_64__)
/* Makes every later mbind of this process fail with EPERM, as a container's seccomp profile may (seccomp
 * filter: x86-64's mbind answers EPERM, everything else runs). */
static bool forbid_mbind(void) {
  struct sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_mbind, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {(unsigned short)(sizeof filter / sizeof *filter), filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

/* Pages of the process's address space (/proc/self/statm's first field). */
static long mapped_pages(void) {
  long pages = -1;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f) {
    if (fscanf(f, "%ld", &pages) != 1) pages = -1;
    fclose(f);
  }
  return pages;
}

/* Where the system refuses the placement: UATTN_ERR_UNSUPPORTED with a message that says what to use instead,
 * *out untouched, the mapping given back. In a child process, whose seccomp filter stays with it. */
Test(cache_memory, runtime_cache_says_so_where_placement_is_refused) {
  uattn_runtime *rt = create(NULL);
  const pid_t pid = fork();
  cr_assert(pid >= 0, "fork failed");
  if (pid == 0) {
    if (!forbid_mbind()) _exit(3); /* no seccomp here: nothing to check */
    const long before = mapped_pages();
    void *p = (void *)1;
    const uattn_status st = uattn_runtime_cache_alloc(rt, 64u << 20, &p);
    const bool said = strstr(uattn_last_error(), "mbind") && strstr(uattn_last_error(), "uattn_cache_alloc");
    const long after = mapped_pages();
    if (st != UATTN_ERR_UNSUPPORTED) _exit(10 + (int)st);
    if (!said) _exit(4);
    if (p != (void *)1) _exit(5);
    if (after - before >= (32l << 20) / sysconf(_SC_PAGESIZE)) _exit(6); /* the 64 MiB stayed mapped */
    _exit(0);
  }
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status), "the child died (signal %d)", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  const int code = WEXITSTATUS(status);
  if (code != 3)
    cr_assert_eq(code, 0, "%s",
                 code == 4   ? "the message does not name mbind and uattn_cache_alloc"
                 : code == 5 ? "a refused call wrote *out"
                 : code == 6 ? "the refused mapping was not given back"
                             : "another status than UATTN_ERR_UNSUPPORTED (10 + status)");
  uattn_runtime_destroy(rt);
}
#endif

Test(cache_memory, runtime_cache_refuses_bad_requests_and_leaves_out_alone) {
  uattn_runtime *rt = create(NULL);
  void *p = (void *)1;
  cr_assert_eq(uattn_runtime_cache_alloc(NULL, 1, &p), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(uattn_last_error(), "rt"), "%s", uattn_last_error());
  cr_assert_eq(uattn_runtime_cache_alloc(rt, 1, NULL), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(uattn_last_error(), "out"), "%s", uattn_last_error());
  cr_assert_eq(uattn_runtime_cache_alloc(rt, 0, &p), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(uattn_last_error(), "bytes is 0"), "%s", uattn_last_error());
  cr_assert_eq(uattn_runtime_cache_alloc(rt, SIZE_MAX, &p), UATTN_ERR_OVERFLOW);
  cr_assert_eq(uattn_runtime_cache_alloc(rt, (size_t)1 << 62, &p), UATTN_ERR_NO_MEMORY, "4 EiB: %s",
               uattn_last_error());
  cr_assert_eq(p, (void *)1, "a refused call wrote *out");
  uattn_runtime_destroy(rt);
}

Test(cache_memory, refuses_bad_requests_and_leaves_out_alone) {
  void *p = (void *)1;
  cr_assert_eq(uattn_cache_alloc(1, NULL), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(uattn_last_error(), "out"), "%s", uattn_last_error());
  cr_assert_eq(uattn_cache_alloc(0, &p), UATTN_ERR_INVALID_ARGUMENT);
  cr_assert(strstr(uattn_last_error(), "bytes is 0"), "%s", uattn_last_error());
  cr_assert_eq(uattn_cache_alloc(SIZE_MAX, &p), UATTN_ERR_OVERFLOW);
  cr_assert_eq(uattn_cache_alloc(SIZE_MAX - (2u << 20), &p), UATTN_ERR_OVERFLOW); /* no room for the alignment */
  cr_assert_eq(uattn_cache_alloc((size_t)1 << 62, &p), UATTN_ERR_NO_MEMORY, "4 EiB: %s", uattn_last_error());
  cr_assert(strstr(uattn_last_error(), "mmap"), "%s", uattn_last_error());
  cr_assert_eq(p, (void *)1, "a refused call wrote *out");
}
