#!/usr/bin/python3
"""record_report.py: turns `perf script` output of a uattn run into a report that names every kernel by its
bucket, and optionally into a folded stack file for flame graphs. Driven by perf/record/record.sh; stdlib only.

Input: `perf script -F comm,tid,time,period,ip,sym,dso` with call chains (perf record -g), on stdin or a file.
Every sample counts by its period (cpu-clock: nanoseconds), so shares are shares of CPU time.

What it does with each sample:
  * frames in uattn's own binaries are expanded through addr2line into their inlined functions (the build
    has -g), so the forward's parts, which the compiler inlines into one job function, are seen;
  * the leaf frame's function is put in a group: a generated kernel by its bucket (the name
    uattn_<dtype>_<part>_b<block>_d<headdim>_c<chunk>__<isa> says it all), a generic kernel set, the forward's
    orchestration, the thread pool, the planner, the benchmark harness, libc, the Linux kernel, JIT code;
  * the libxsmm body (kernels/avx2/xsmm.c and the JIT GEMMs it calls, which uattn names in /tmp/perf-<pid>.map as
    libxsmm_smm_m<M>_n<N>_k<K>_beta<B> when UATTN_PERF_MAP=1) is grouped with the bucket it works for: the
    generated kernel on its stack, else the one bucket whose kernels the same part ran (a bucket's causal and
    shared kernels hand their jobs to the body by a tail call, so their frame is not on its stacks);
  * the sample is given a part (causal, shared, unique, ...) from the nearest frame up its stack that names
    one: a generated kernel's name, or one of the forward's part functions (PART_FUNCS).
"""
import argparse
import collections
import os
import re
import signal
import subprocess
import sys

KERNEL_NAME = re.compile(
    r"^uattn_(?P<dtype>[a-z0-9]+)_(?P<part>[a-z]+)_b(?P<block>\d+)_d(?P<hd>\d+)_c(?P<chunk>\d+)__(?P<isa>\w+)$")
# gcc's clones and split-off parts of one function: counted as the function
CLONE_SUFFIX = re.compile(r"(\.(constprop|isra|part|cold|lto_priv|localalias)(\.\d+)?)+$")
# The forward's functions (runtime/attention/: parts.c, units.c, cache.c) that say which part of the attention a
# frame below them works for; a generated kernel's name says it by itself. Keep in step with those files.
PART_FUNCS = {
    "uattn_causal_part": "causal",
    "uattn_shared_part": "shared",
    "uattn_shared_part_prefix_run": "shared",
    "uattn_shared_part_all_heads": "shared",
    "uattn_unique_part": "unique",
    "uattn_unique_part_all_heads": "unique",
    "uattn_cross_part": "cross",
    "merge_tile": "merge (per tile)",
    "merge_splits_job": "merge (split-K)",
    "uattn_write_cache": "cache write",
    "widen_queries": "query load",
}
ATTENTION_PARTS = {"causal", "shared", "unique", "cross"}
# frames that mean "inside one uattn_forward call"
FORWARD_FUNCS = {"uattn_forward", "attention_job", "merge_splits_job"}
# where a complete user stack ends
STACK_ROOTS = {"main", "_start", "__libc_start_main", "__libc_start_call_main", "start_thread", "clone", "clone3",
               "_dl_start_user"}

# uattn's names for libxsmm's JIT GEMMs in its perf map (kernels/avx2/xsmm.c, perf_map_add)
XSMM_JIT_NAME = re.compile(r"^libxsmm_[a-z]*mm_m\d+_n\d+_k\d+_beta\d+$")
# a placeholder group, made into the body of a bucket (or of the generic sets) once the sample's part is known
XSMM_BODY = "uattn kernels: libxsmm body"

# groups by source file basename (the library's files; see README's Layout)
FILE_GROUPS = {
    "avx2/set.c": "uattn kernels: avx2 set (generic)",
    "avx512/set.c": "uattn kernels: avx512 set (generic)",
    "portable.c": "uattn kernels: portable set (generic)",
    "convert.c": "uattn kernels: dtype conversion",
    "xsmm.c": XSMM_BODY,
    "dispatch.c": "uattn kernels: selection",
    "forward.c": "uattn forward: orchestration, cache write",
    "validate.c": "uattn forward: orchestration, cache write",
    "cache.c": "uattn forward: orchestration, cache write",
    "workspace.c": "uattn forward: orchestration, cache write",
    "parts.c": "uattn forward: orchestration, cache write",
    "units.c": "uattn forward: orchestration, cache write",
    "attention/cascade.c": "uattn forward: merges",
    "pool.c": "uattn runtime: thread pool (spin, wait, dispatch)",
    "runtime.c": "uattn runtime: setup",
    "topology.c": "uattn runtime: setup",
    "planner.c": "uattn planner",
    "plan_create.c": "uattn planner",
    "bucketing.c": "uattn planner",
    "graph_tensors.c": "uattn planner",
    "batch_utils.c": "uattn planner",
    "decode_prefill_split.c": "uattn planner",
    "batch_checks.c": "uattn planner",
    "error.c": "uattn runtime: errors, allocation",
    "alloc.c": "uattn runtime: errors, allocation",
}
LIBC = re.compile(r"^(libc|libm|libpthread|libdl|librt|libgcc_s|libmvec|ld-linux[^/]*)([.-]|$)")
JIT_DSO = re.compile(r"(^|/)perf-\d+\.map$|^\[JIT\]|^//anon|^\[anon")


def base_name(sym):
    return CLONE_SUFFIX.sub("", sym)


def is_kernel_addr(ip, dso):
    return dso == "[kernel.kallsyms]" or dso.startswith("[kernel") or ip >= 0xffff800000000000


# ---- perf script ---------------------------------------------------------------------------------------

HEADER = re.compile(r"^(?P<comm>\S.*?)\s+(?P<tid>\d+)\s+(?:\[\d+\]\s+)?(?P<time>\d+\.\d+):\s+(?P<period>\d+)\s*")
FRAME = re.compile(r"^\s+(?P<ip>[0-9a-f]+)\s+(?P<sym>.*?)(?:\+0x[0-9a-f]+)?\s+\((?P<dso>.*)\)\s*$")


def read_samples(stream):
    """Yields (comm, tid, time, period, [(ip, sym, dso), ...] leaf first)."""
    head, frames = None, []
    for line in stream:
        line = line.rstrip("\n")
        if not line.strip():
            if head:
                yield head + (frames,)
            head, frames = None, []
            continue
        if line[0] in " \t":
            m = FRAME.match(line)
            # perf's own inlined frames (DWARF unwinding) go: uattn's frames are expanded by addr2line
            # below, and other libraries' inlined helpers say nothing a user of uattn acts on
            if m and head and m.group("dso") != "inlined":
                frames.append((int(m.group("ip"), 16), m.group("sym"), m.group("dso")))
            continue
        if head:
            yield head + (frames,)
        m = HEADER.match(line)
        head = (m.group("comm"), int(m.group("tid")), float(m.group("time")), int(m.group("period"))) if m else None
        frames = []
    if head:
        yield head + (frames,)


# ---- symbols: addr2line for inlined frames, nm for source files -----------------------------------------

class Symbols:
    """Resolves frames of uattn's binaries to their inline chains and source files."""

    def __init__(self, own_dsos, srcroot, builddir, lib):
        self.own = set(own_dsos)
        self.srcroot = os.path.realpath(srcroot) if srcroot else None
        self.builddir = os.path.realpath(builddir) if builddir else None
        self.chains = {}  # (dso, ip, leaf) -> [(func, file)] innermost first, or None
        self.sym_file = self._nm_files(lib) if lib else {}
        self.have_addr2line = subprocess.call(["sh", "-c", "command -v addr2line"], stdout=subprocess.DEVNULL) == 0

    @staticmethod
    def _nm_files(lib):
        """symbol -> source file basename, from the static library's members (planner.c.o -> planner.c)."""
        out = {}
        try:
            text = subprocess.run(["nm", "-A", "--defined-only", lib], capture_output=True, text=True).stdout
        except OSError:
            return out
        for line in text.splitlines():
            m = re.match(r"^[^:]*:([^:]+)\.o:\s*[0-9a-f]*\s+[tTwW]\s+(\S+)$", line)
            if m:
                name = base_name(m.group(2))
                out[name] = m.group(1) if name not in out or out[name] == m.group(1) else "?"
        return out

    def owns(self, dso):
        return dso in self.own

    def resolve(self, wanted):
        """wanted: set of (dso, ip, leaf). One addr2line per binary."""
        if not self.have_addr2line:
            return
        by_dso = collections.defaultdict(list)
        for key in wanted:
            if key not in self.chains:
                by_dso[key[0]].append(key)
        for dso, keys in by_dso.items():
            if not os.path.exists(dso):
                continue
            # a caller frame's address is the return address: the call is the instruction before it
            addrs = ["0x%x" % (ip if leaf else ip - 1) for _, ip, leaf in keys]
            try:
                res = subprocess.run(["addr2line", "-e", dso, "-f", "-i", "-a"], input="\n".join(addrs) + "\n",
                                     capture_output=True, text=True)
            except OSError:
                return
            chains, cur = [], None
            lines = res.stdout.splitlines()
            i = 0
            while i < len(lines):
                if re.match(r"^0x[0-9a-f]+$", lines[i]):
                    cur = []
                    chains.append(cur)
                    i += 1
                    continue
                func, loc = lines[i], lines[i + 1] if i + 1 < len(lines) else "??:0"
                if cur is not None:
                    cur.append((func, loc.rsplit(":", 1)[0]))
                i += 2
            for key, chain in zip(keys, chains):
                ok = chain and chain[-1][0] != "??"
                self.chains[key] = chain if ok else None

    def chain(self, dso, ip, leaf):
        return self.chains.get((dso, ip, leaf))

    def source_of(self, sym, chain):
        """(basename, kind): kind 'generated' for sources in the build tree, 'src' for the source tree."""
        path = chain[-1][1] if chain else None
        if path and path != "??":
            real = os.path.realpath(path)
            if self.builddir and real.startswith(self.builddir + os.sep):
                return os.path.basename(real), "generated"
            rel = os.path.relpath(real, self.srcroot) if self.srcroot else real
            return os.path.basename(real), rel.split(os.sep)[0]
        f = self.sym_file.get(base_name(sym))
        if f and f != "?":
            return f, "lib"
        return None, None


# ---- classification ------------------------------------------------------------------------------------

def classify(sym, dso, ip, chain, syms, exe):
    """The group a leaf frame's self time belongs to, and the kernel bucket match if it is one."""
    name = base_name(sym)
    m = KERNEL_NAME.match(name)
    if m:
        return "uattn kernels: generated " + bucket_label(m), m
    if is_kernel_addr(ip, dso):
        return "Linux kernel (page faults, system calls, interrupts)", None
    if JIT_DSO.search(dso):
        if sym == "[unknown]" or re.match(r"^0x[0-9a-f]+$", sym):
            return "JIT code: unresolved [JIT] addresses", None
        if XSMM_JIT_NAME.match(sym):
            return XSMM_BODY, None
        return "JIT code: named by a perf map", None
    base = os.path.basename(dso)
    if dso == "[vdso]":
        return "libc, libm, ld.so (and the vdso)", None
    if LIBC.match(base):
        return "libc, libm, ld.so (and the vdso)", None
    if base.startswith("libhwloc"):
        return "hwloc", None
    if syms.owns(dso):
        fname, kind = syms.source_of(sym, chain)
        if kind == "generated":
            return "uattn kernels: generated (helpers)", None
        if fname in FILE_GROUPS and kind in ("runtime", "kernels", "lib"):
            return FILE_GROUPS[fname], None
        if kind == "kernels":
            return "uattn kernels: %s" % fname, None
        if kind == "runtime":
            return "uattn runtime: %s" % fname, None
        if kind in ("perf", "tests"):
            return "harness: %s (%s)" % (os.path.basename(exe or dso), fname), None
        if name.startswith("libxsmm"):
            return "libxsmm (its static code, not its JIT kernels)", None
        if name.startswith(("uattn_plan", "uattn_bucket")):
            return "uattn planner", None
        if name.startswith("uattn_"):
            return "uattn: other", None
        if sym == "[unknown]":
            return "unknown addresses in %s" % base, None
        return "harness: %s" % os.path.basename(exe or dso), None
    if sym == "[unknown]":
        return "unknown addresses in %s" % (base or "?"), None
    return "other libraries: %s" % base, None


def expanded(frames, syms):
    """The sample's frames leaf first, each (name, kind) with inlined functions in their place, where kind is
    '' (a real frame), 'i' (inlined), 'k' (Linux kernel) or 'j' (JIT code)."""
    out = []
    for n, (ip, sym, dso) in enumerate(frames):
        chain = syms.chain(dso, ip, n == 0) if syms.owns(dso) else None
        if chain:
            for j, (func, path) in enumerate(chain):
                if "/lib/gcc/" in path or func.startswith("_mm"):  # intrinsics' headers
                    continue
                out.append((func, "" if j == len(chain) - 1 else "i"))
        elif is_kernel_addr(ip, dso):
            out.append((sym, "k"))
        elif JIT_DSO.search(dso):
            out.append((sym if sym != "[unknown]" else "[JIT] 0x%x" % ip, "j"))
        else:
            out.append((sym if sym != "[unknown]" else "[unknown] (%s)" % os.path.basename(dso), ""))
    return out


def bucket_label(m):
    """'bf16 b128 d128 c0 avx2' for a KERNEL_NAME match."""
    return "%s b%s d%s c%s %s" % (m.group("dtype"), m.group("block"), m.group("hd"), m.group("chunk"), m.group("isa"))


def bucket_on(stack):
    """The bucket of the nearest generated kernel up the stack, or None."""
    for func, _ in stack:
        m = KERNEL_NAME.match(base_name(func))
        if m:
            return bucket_label(m)
    return None


def part_of(stack):
    """The part of the attention a sample worked for: the nearest frame up the stack that names one. A
    generated kernel that is not itself a part (the panel loads, uattn_<dtype>_load_...) works for the part
    that called it; its own name is the answer only when no part is found above it."""
    helper = None
    for func, _ in stack:
        m = KERNEL_NAME.match(base_name(func))
        if m:
            if m.group("part") in ATTENTION_PARTS:
                return m.group("part")
            helper = helper or m.group("part")
        elif func in PART_FUNCS:
            return PART_FUNCS[func]
    return helper


# ---- report --------------------------------------------------------------------------------------------

def pct(x, total):
    return 100.0 * x / total if total else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("script", nargs="?", default="-", help="perf script output (default: stdin)")
    ap.add_argument("--own", action="append", default=[],
                    help="a binary whose frames are uattn's (or the harness's); repeatable")
    ap.add_argument("--exe", help="the profiled program, for labels")
    ap.add_argument("--srcroot", help="uattn's source tree")
    ap.add_argument("--builddir", help="the build tree (generated kernel sources live there)")
    ap.add_argument("--lib", help="libuattn.a, to place symbols in source files when there is no debug info")
    ap.add_argument("--top", type=int, default=25, help="rows of the per-symbol table (default 25)")
    ap.add_argument("--folded", help="write folded stacks here ('frame;frame;frame count', root first)")
    ap.add_argument("--jit-threshold", type=float, default=1.0,
                    help="warn when unresolved JIT code takes more than this %% of samples (default 1)")
    ap.add_argument("--title", default="", help="first line of the report")
    a = ap.parse_args()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # a report piped into head is not an error

    stream = sys.stdin if a.script == "-" else open(a.script, errors="replace")
    samples = list(read_samples(stream))
    if not samples:
        print("record_report.py: no samples in the perf script output", file=sys.stderr)
        return 1
    syms = Symbols(a.own, a.srcroot, a.builddir, a.lib)
    wanted = set()
    for s in samples:
        for n, (ip, _, dso) in enumerate(s[4]):
            if syms.owns(dso):
                wanted.add((dso, ip, n == 0))
    syms.resolve(wanted)

    total = 0
    n_samples = len(samples)
    tids = set()
    t0, t1 = min(s[2] for s in samples), max(s[2] for s in samples)
    by_group = collections.Counter()
    group_samples = collections.Counter()
    by_sym = collections.Counter()
    sym_samples = collections.Counter()
    by_part = collections.Counter()
    part_syms = collections.defaultdict(collections.Counter)
    in_forward = 0
    buckets = collections.defaultdict(collections.Counter)  # bucket -> part -> period
    inline_in = collections.defaultdict(collections.Counter)  # leaf symbol -> innermost own function
    folded = collections.Counter()
    truncated = own_leaf = 0
    jit_unresolved = 0
    prepared = []
    part_buckets = collections.defaultdict(collections.Counter)  # part -> buckets whose kernels ran in it
    every_bucket = set()
    for comm, tid, _, period, frames in samples:
        if not frames:
            frames = [(0, "[unknown]", "[unknown]")]
        # drop the zero or unknown addresses a broken unwind leaves at the root
        while len(frames) > 1 and frames[-1][1] == "[unknown]" and frames[-1][2] == "[unknown]":
            frames = frames[:-1]
        stack = expanded(frames, syms)
        part, bucket = part_of(stack), bucket_on(stack)
        if bucket:
            every_bucket.add(bucket)
            if part:
                part_buckets[part][bucket] += period
        prepared.append((comm, tid, period, frames, stack, part, bucket))

    def xsmm_body_group(part, bucket):
        """The group of the libxsmm body's time in a part: its bucket's, where one is known. When no bucket's
        kernel was seen in the part (or, without debug info, the part is not known): the one bucket that ran at
        all, if there is one; none at all is a generic kernel set's body."""
        seen = set(part_buckets.get(part, ())) or every_bucket
        if not bucket and len(seen) == 1:
            bucket = next(iter(seen))
        if bucket:
            return "uattn kernels: generated %s, libxsmm body" % bucket, bucket
        return XSMM_BODY + (" (bucket unknown)" if seen else " (generic)"), None

    for comm, tid, period, frames, stack, part, stack_bucket in prepared:
        total += period
        tids.add(tid)
        ip, sym, dso = frames[0]
        chain = syms.chain(dso, ip, True) if syms.owns(dso) else None
        leaf = chain[-1][0] if chain else sym
        group, km = classify(leaf, dso, ip, chain, syms, a.exe)
        if group.startswith("Linux kernel"):
            # whose page faults and system calls: the group of the first user-space frame above
            # (past libc's system call wrappers, to their caller where the unwind reaches it)
            for n, (uip, usym, udso) in enumerate(frames):
                if not is_kernel_addr(uip, udso) and usym != "[unknown]":
                    uchain = syms.chain(udso, uip, n == 0) if syms.owns(udso) else None
                    ugroup, _ = classify(uchain[-1][0] if uchain else usym, udso, uip, uchain, syms, a.exe)
                    if ugroup == XSMM_BODY:
                        ugroup = xsmm_body_group(part, stack_bucket)[0]
                    if group.startswith(("Linux kernel (", "Linux kernel, for libc")):
                        group = "Linux kernel, for %s" % ugroup
                    if not ugroup.startswith("libc"):
                        break
        xsmm_bucket = None
        if group == XSMM_BODY:
            group, xsmm_bucket = xsmm_body_group(part, stack_bucket)
        if group.startswith("JIT code: unresolved"):
            jit_unresolved += period
        name = base_name(leaf) if leaf != "[unknown]" else "[unknown] 0x%x (%s)" % (ip, os.path.basename(dso))
        if group.startswith("JIT code: unresolved"):
            name = "[JIT] unresolved addresses (%s)" % os.path.basename(dso)
        by_group[group] += period
        group_samples[group] += 1
        # a symbol per group: the Linux kernel's clear_page for the harness and for a kernel are two rows
        by_sym[name, group] += period
        sym_samples[name, group] += 1
        if syms.owns(dso):
            own_leaf += 1
            if base_name(stack[-1][0]) not in STACK_ROOTS and not any(f in STACK_ROOTS for f, _ in stack):
                truncated += 1
            if chain and chain[0][1] not in ("??", ""):  # debug info: the inlined functions are known
                inner = [f for f, p in chain if "/lib/gcc/" not in p and not f.startswith("_mm")]
                inline_in[name][inner[0] if inner else name] += period
        funcs = {base_name(f) for f, _ in stack}
        if km:
            buckets[group][km.group("part")] += period
        elif xsmm_bucket:  # the bucket's causal or shared kernel, as the libxsmm body that ran it
            buckets["uattn kernels: generated " + xsmm_bucket][part or "(no part)"] += period
        if part or km or funcs & FORWARD_FUNCS:
            in_forward += period
            p = part or "(no part: dispatch, wait, set-up)"
            by_part[p] += period
            part_syms[p][name] += period
        if a.folded:
            suffix = {"": "", "i": "_[i]", "k": "_[k]", "j": "_[j]"}
            names = [comm] + [f.replace(";", ":").replace(" ", "_") + suffix[k] for f, k in reversed(stack)]
            folded[";".join(names)] += 1

    out = []
    w = out.append
    if a.title:
        w(a.title)
    w("%d samples over %.2f s of wall time, %d threads; shares are of sampled CPU time (period-weighted)"
      % (n_samples, t1 - t0, len(tids)))
    mine = sum(v for g, v in by_group.items() if g.startswith(("uattn", "Linux kernel, for uattn")))
    harness = sum(v for g, v in by_group.items() if g.startswith(("harness", "Linux kernel, for harness")))
    w("uattn's code and the Linux kernel's work for it: %.1f%%; the program around it (harness): %.1f%%; "
      "the rest: %.1f%%" % (pct(mine, total), pct(harness, total), pct(total - mine - harness, total)))
    if pct(jit_unresolved, total) > a.jit_threshold:
        w("")
        w("WARNING: %.1f%% of the samples are in JIT code perf cannot name (bare [JIT] addresses). A JIT that "
          "writes /tmp/perf-<pid>.map" % pct(jit_unresolved, total))
        w("  (\"START SIZE name\" per kernel, hex) lets perf name them: uattn writes one for its libxsmm "
          "kernels when UATTN_PERF_MAP=1,")
        w("  which perf/record/record.sh sets unless the environment does. The map files must still exist when the "
          "report is made.")
    if own_leaf and truncated > 0.1 * own_leaf:
        w("")
        w("WARNING: %.0f%% of the call chains from uattn code do not reach main or a thread start: build with "
          "-fno-omit-frame-pointer" % pct(truncated, own_leaf))
        w("  (record.sh's own build does) or record with --dwarf; the part table below is then incomplete.")

    w("")
    w("Where the time goes (self time by group)")
    width = max(40, max(len(g) for g in by_group))
    w("  %-*s %7s %8s" % (width, "group", "share", "samples"))
    for g, v in by_group.most_common():
        w("  %-*s %6.1f%% %8d" % (width, g, pct(v, total), group_samples[g]))

    w("")
    w("By part of the attention (samples inside uattn_forward: %.1f%% of all; each part with its hottest "
      "functions)" % pct(in_forward, total))
    if in_forward:
        w("  %-34s %7s %10s  %s" % ("part", "share", "of forward", "top functions (share of the part)"))
        for p, v in by_part.most_common():
            tops = ", ".join("%s %.0f%%" % (s, pct(sv, v)) for s, sv in part_syms[p].most_common(3))
            w("  %-34s %6.1f%% %9.1f%%  %s" % (p, pct(v, total), pct(v, in_forward), tops))
    else:
        w("  (no sample inside uattn_forward)")

    w("")
    w("By kernel bucket (generated kernels uattn_<dtype>_<part>_b<block>_d<headdim>_c<chunk>__<isa>)")
    if buckets:
        parts = sorted({p for b in buckets.values() for p in b})
        w("  %-34s %7s  %s" % ("dtype block headdim chunk isa", "share", "  ".join("%8s" % p for p in parts)))
        for b, pv in sorted(buckets.items(), key=lambda kv: -sum(kv[1].values())):
            w("  %-34s %6.1f%%  %s" % (b.replace("uattn kernels: generated ", ""), pct(sum(pv.values()), total),
                                      "  ".join("%7.1f%%" % pct(pv[p], total) for p in parts)))
    else:
        generic = sum(v for g, v in by_group.items() if "(generic)" in g)
        w("  no generated kernel ran; the generic kernel sets took %.1f%% (their buckets are not in their names)"
          % pct(generic, total))

    w("")
    w("Top %d symbols (self time)" % a.top)
    w("  %7s %8s  %-40s %s" % ("share", "samples", "symbol", "group"))
    for (s, g), v in by_sym.most_common(a.top):
        w("  %6.1f%% %8d  %-40s %s" % (pct(v, total), sym_samples[s, g], s, g))

    hot = [s for (s, g), _ in by_sym.most_common()
           if g.startswith("uattn kernels") and set(inline_in.get(s, ())) - {s}][:3]
    if hot:
        w("")
        w("Inside the hottest kernels (self time by inlined function, from debug info)")
        for s in hot:
            parts = inline_in[s]
            tot = sum(parts.values())
            w("  %-40s %s" % (s, ", ".join("%s %.0f%%" % (f, pct(v, tot)) for f, v in parts.most_common(6))))
    print("\n".join(out))

    if a.folded:
        with open(a.folded, "w") as f:
            for stack, n in sorted(folded.items()):
                f.write("%s %d\n" % (stack, n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
