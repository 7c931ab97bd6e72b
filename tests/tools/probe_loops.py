#!/usr/bin/env python3
"""Holds perf/common/probe.c's loops to their intent, on the object the compiler made of them.

    probe_loops.py PROBE_H PROBE_OBJECT

A peak is only the machine's when each loop's step is its CHAINS independent accumulator chains (probe.h's
BENCH_PROBE_*_CHAINS), kept in registers: chains the compiler merged (equal starts, equal operands) or
accumulators it keeps in memory measure the compiler instead. For each loop of the table below, in the
innermost loop of the disassembly that holds its instruction:
  - the instruction's count is a multiple of CHAINS and it writes exactly CHAINS distinct registers;
  - no instance reads another chain's register (each reads its own only: the chains are independent);
  - no other instruction of the loop touches an accumulator (no spill, reload or move);
  - no instruction of the loop stores to memory, and the compute loops load nothing either.
The object is read, not run, so the test runs on every CPU; a loop whose target the compiler lacks (AVX512-BF16
before GCC 10, AMX before GCC 11) is absent from the object and reported as such. Exit 77 (a skip) where the
object is not x86-64 or objdump is missing.
"""
import os
import re
import shutil
import subprocess
import sys

# function in probe.c, its CHAINS name in probe.h, the instruction a step is made of, its registers' class,
# whether it is a read loop (its instruction accumulates a load), and whether every x86-64 compiler builds it
LOOPS = [
    ("probe_fma_zmm", "FMA", r"vfmadd(132|213|231)ps", "zmm", False, True),
    ("probe_fma_ymm", "FMA", r"vfmadd(132|213|231)ps", "ymm", False, True),
    ("probe_bf16_dot_zmm", "BF16", r"vdpbf16ps", "zmm", False, False),
    ("probe_amx_bf16", "AMX", r"tdpbf16ps", "tmm", False, False),
    ("probe_read_ymm", "READ", r"vaddps", "ymm", True, True),
]

FUNC = re.compile(r"^([0-9a-f]+) <([^>]+)>:$")
INSN = re.compile(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$")
REG = re.compile(r"%([xyz]mm|tmm)(\d+)")


def chains_of(header):
    with open(header) as f:
        return {m.group(1): int(m.group(2)) for m in re.finditer(r"#define BENCH_PROBE_(\w+)_CHAINS (\d+)", f.read())}


def operands(text):
    """AT&T operands split at the top-level commas (a memory operand's own commas kept)."""
    text = text.split("#")[0].split("<")[0].strip()
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def reg_key(op):
    """A vector register's identity whatever its width (xmm5, ymm5 and zmm5 are one register), or None."""
    m = REG.fullmatch(op)
    if not m:
        return None
    return ("tmm" if m.group(1) == "tmm" else "vec", int(m.group(2)))


def functions(objdump_text):
    funcs, cur = {}, None
    for line in objdump_text.splitlines():
        m = FUNC.match(line)
        if m:
            cur = m.group(2)
            funcs[cur] = []
            continue
        m = INSN.match(line)
        if m and cur is not None:
            funcs[cur].append((int(m.group(1), 16), m.group(2), m.group(3)))
    return funcs


def loops(insns):
    """Each backward jump's loop: the instructions from its target to the jump."""
    out = []
    for addr, mnem, ops in insns:
        if not mnem.startswith("j"):
            continue
        t = re.match(r"([0-9a-f]+)\b", ops.strip())
        if not t:
            continue
        target = int(t.group(1), 16)
        if target <= addr:
            out.append([i for i in insns if target <= i[0] <= addr])
    return out


def check(name, insns, chains, pattern, cls, is_read):
    key = re.compile(pattern + r"[xyz]?$")
    with_key = [lp for lp in loops(insns) if any(key.match(i[1]) for i in lp)]
    if not with_key:
        return [f"{name}: no loop holds its {pattern}"]
    inner = [lp for lp in with_key if not any(o is not lp and len(o) < len(lp) and o[0][0] >= lp[0][0]
                                              and o[-1][0] <= lp[-1][0] for o in with_key)]
    errors = []
    for lp in inner:
        body = [i for i in lp if not i[1].startswith("nop")]
        steps = [(m, operands(o)) for _, m, o in body if key.match(m)]
        dests = [ops[-1] for _, ops in steps]
        where = f"{name} (loop at {lp[0][0]:#x})"
        if any(not re.fullmatch(rf"%{cls}\d+", d) for d in dests):
            errors.append(f"{where}: an accumulator outside the {cls} registers: {sorted(set(dests))}")
            continue
        acc = {reg_key(d) for d in dests}
        if len(steps) % chains or len(acc) != chains:
            errors.append(f"{where}: {len(steps)} {pattern} into {len(acc)} registers; {chains} chains expected")
        for (m, ops) in steps:
            own = reg_key(ops[-1])
            srcs = [reg_key(o) for o in ops[:-1]]
            if any(s in acc and s != own for s in srcs):
                errors.append(f"{where}: {m} {','.join(ops)} reads another chain's accumulator")
            if is_read and own not in srcs:
                errors.append(f"{where}: {m} {','.join(ops)} does not add into its own accumulator")
        for _, m, o in body:
            ops = operands(o)
            if key.match(m):
                mem = [x for x in ops if "(" in x]
                if mem and (not is_read or "(" in ops[-1]):
                    errors.append(f"{where}: {m} {o} touches memory")
                continue
            if any(reg_key(x) in acc for x in ops):
                errors.append(f"{where}: {m} {o} moves an accumulator (a spill, a reload or a copy)")
            if ops and "(" in ops[-1] and not m.startswith(("cmp", "test")):
                errors.append(f"{where}: {m} {o} stores to memory")
            elif not is_read and any("(" in x for x in ops):
                errors.append(f"{where}: {m} {o} loads inside a compute loop")
    return errors


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    header, obj = sys.argv[1], sys.argv[2]
    objdump = os.environ.get("OBJDUMP", "objdump")
    if not shutil.which(objdump):
        print(f"probe_loops: {objdump} not found (binutils); skipped")
        return 77
    head = subprocess.run([objdump, "-f", obj], capture_output=True, text=True, check=True).stdout
    if "x86-64" not in head:
        print("probe_loops: not an x86-64 object; the scalar loops have no chains to hold; skipped")
        return 77
    text = subprocess.run([objdump, "-d", "--no-show-raw-insn", "-M", "att", obj], capture_output=True, text=True,
                          check=True).stdout
    funcs, chains = functions(text), chains_of(header)
    errors = []
    for name, what, pattern, cls, is_read, required in LOOPS:
        if what not in chains:
            errors.append(f"{header}: no BENCH_PROBE_{what}_CHAINS")
            continue
        if name not in funcs:
            if required:
                errors.append(f"{name}: not in {obj} (inlined, cloned or renamed?)")
            else:
                print(f"{name}: absent (this compiler lacks its target)")
            continue
        e = check(name, funcs[name], chains[what], pattern, cls, is_read)
        errors += e
        if not e:
            print(f"{name}: {chains[what]} independent {pattern} chains in {cls} registers")
    for e in errors:
        print("FAIL " + e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
