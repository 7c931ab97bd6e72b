#!/usr/bin/env python3
"""The kernel generator: one specialized kernel source per bucket, the registry that maps a bucket to it, and
the ISA ladder, all from gen/manifest.json (the ISAs, best first, and the default buckets).

A bucket is (cache dtype, block size, head dim, chunk size), the CPU twin of the static shapes an HPU graph
is compiled for. Its source instantiates an ISA's kernel bodies (kernels/<isa>/body.h, through
kernels/<isa>/bucket.h) with those numbers as compile-time constants, and names every function after them:

    uattn_<dtype>_<part>_b<block>_d<head dim>_c<chunk>__<isa>     e.g. uattn_bf16_unique_b128_d128_c0__avx2

so a profile, or uattn_last_forward_report, says which bucket and which part of the attention ran.

The bucket list is the build option UATTN_KERNEL_BUCKETS (its default: the manifest's default_buckets):
groups separated by spaces, each group DTYPES:BLOCK_SIZES:HEAD_DIMS:CHUNK_SIZES of comma-separated values,
standing for all their combinations:

    "bf16:16,32,64,128,256:128:0 f32:16:64,128:0"

Each bucket is written for every ISA of the manifest whose dtypes take its cache dtype. registry.c holds
uattn_bucket_registry (every bucket source's entry, best ISA first) and uattn_isa_registry (the generic sets,
best first, portable last, each with its probe): kernels/dispatch.c, the tests and uattn-kernel-bench walk
these, so the manifest is the one place that names them.

Usage:
    generate.py --default-buckets                    the manifest's default bucket list (for CMake)
    generate.py --buckets SPEC --list               the sources it would write, one per line (for CMake)
    generate.py --buckets SPEC --out DIR            writes DIR/<bucket>.c and DIR/registry.c

Standard library only; files are rewritten only when their text changes, so a re-run does not rebuild.
"""
import argparse
import json
import os
import sys

MANIFEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "manifest.json")
PARTS = ["causal", "shared", "unique"]  # uattn_part order


def load_manifest(path):
    """The manifest's ISA ladder, dtypes and default buckets; raises ValueError on one that breaks the rules
    the generated code relies on."""
    with open(path) as f:
        m = json.load(f)
    ladder, dtypes = m["isas"]["ladder"], m["dtypes"]
    names = [isa["name"] for isa in ladder]
    if len(set(names)) != len(names):
        raise ValueError("an ISA is listed twice")
    for i, isa in enumerate(ladder):
        last = i == len(ladder) - 1
        if (isa["probe"] is None) != last:  # uattn_kernels_select relies on a last set that always runs
            raise ValueError(f"ISA '{isa['name']}': only the last ISA, and it alone, has no probe")
        if last and isa["dtypes"]:
            raise ValueError(f"ISA '{isa['name']}': the last ISA (no probe) has no buckets")
        for d in isa["dtypes"]:
            if d not in dtypes:
                raise ValueError(f"ISA '{isa['name']}': dtype '{d}' is not one of {', '.join(dtypes)}")
        if (isa.get("twin") is None) != (isa.get("twin_probe") is None):
            raise ValueError(f"ISA '{isa['name']}': a twin needs its probe, and a probe its twin")
        for key in ("shares", "decodes"):
            other = next((o for o in ladder if o["name"] == isa[key]), None) if isa[key] else isa
            if other is None or other is not isa and (other[key] or not set(isa["dtypes"]) <= set(other["dtypes"])):
                raise ValueError(f"ISA '{isa['name']}': it {key} '{isa[key]}', which has no own bucket of its dtypes")
    return m


def isas_with_buckets(manifest):
    return [isa for isa in manifest["isas"]["ladder"] if isa["dtypes"]]


def default_buckets(manifest):
    return " ".join(g["buckets"] for g in manifest["default_buckets"]["groups"])


def parse(spec, known):
    """The buckets of SPEC, sorted and without repeats; raises ValueError with a message for the user."""
    buckets = set()
    for group in spec.split():  # an empty list is allowed: generic kernels only
        fields = group.split(":")
        if len(fields) != 4:
            raise ValueError(f"'{group}': a group is DTYPES:BLOCK_SIZES:HEAD_DIMS:CHUNK_SIZES")
        dtypes = fields[0].split(",")
        for d in dtypes:
            if d not in known:
                raise ValueError(f"'{group}': dtype '{d}' is not one of {', '.join(known)}")

        def numbers(text, what, lo, hi):
            try:
                values = [int(x) for x in text.split(",")]
            except ValueError:
                raise ValueError(f"'{group}': {what} must be comma-separated integers") from None
            for v in values:
                if not lo <= v <= hi:
                    raise ValueError(f"'{group}': {what} {v} is outside [{lo}, {hi}]")
            return values

        for d in dtypes:
            for b in numbers(fields[1], "block size", 1, 4096):
                for h in numbers(fields[2], "head dim", 1, 4096):
                    for c in numbers(fields[3], "chunk size", 0, 1 << 20):
                        buckets.add((d, b, h, c))
    return sorted(buckets, key=lambda x: (list(known).index(x[0]), x[1], x[2], x[3]))


def name(bucket, part, isa):
    d, b, h, c = bucket
    return f"uattn_{d}_{part}_b{b}_d{h}_c{c}__{isa}"


def pairs(manifest, buckets):
    """The (bucket, isa) sources to write, best ISA first: every bucket for every ISA that takes its dtype."""
    return [(b, isa["name"]) for isa in isas_with_buckets(manifest) for b in buckets if b[0] in isa["dtypes"]]


def source_name(bucket, isa):
    d, b, h, c = bucket
    return f"bucket_{d}_b{b}_d{h}_c{c}__{isa}.c"


def bucket_source(manifest, bucket, isa):
    d, b, h, c = bucket
    chunk = "the whole shared part at once" if c == 0 else f"shared blocks merged {c} at a time"
    lines = [
        "/* Generated by gen/generate.py from gen/manifest.json and UATTN_KERNEL_BUCKETS: do not edit.",
        f" * Bucket: {d} cache, block size {b}, head dim {h}, chunk size {c} ({chunk}); ISA {isa}. */",
        f"#define BUCKET_DTYPE {manifest['dtypes'][d]}",
        f"#define BUCKET_BLOCK_SIZE {b}",
        f"#define BUCKET_HEAD_DIM {h}",
        f"#define BUCKET_CHUNK_SIZE {c}",
    ]
    # a rung that shares another's load and attend functions, or its decode kernels, names that rung's (which
    # are generated for the same bucket): its source then defines only what it does not share
    entry = next(i for i in manifest["isas"]["ladder"] if i["name"] == isa)
    attend, decode = entry["shares"] or isa, entry["decodes"] or isa
    lines += [f"#define BUCKET_{p.upper()} {name(bucket, p, attend)}" for p in ["load", "load_tiled"] + PARTS]
    lines += [f"#define BUCKET_{p.upper()} {name(bucket, p, decode)}" for p in ["decode", "decode_tiled"]]
    lines += [
        f"#define BUCKET_ENTRY uattn_bucket_{d}_b{b}_d{h}_c{c}__{isa}",
        f'#include "{isa}/bucket.h"',
        "",
    ]
    return "\n".join(lines)


def registry_source(manifest, buckets):
    entries = [f"uattn_bucket_{d}_b{b}_d{h}_c{c}__{isa}" for ((d, b, h, c), isa) in pairs(manifest, buckets)]
    ladder = manifest["isas"]["ladder"]
    lines = [
        "/* Generated by gen/generate.py from gen/manifest.json and UATTN_KERNEL_BUCKETS: do not edit.",
        f" * The registries: {len(entries)} bucket kernels, best ISA first (kernels/dispatch.c looks them up), and",
        f" * the {len(ladder)} generic sets, best first (uattn_kernels_select takes the first this CPU runs). */",
        '#include "kernels.h"',
    ]
    lines += [f'#include "{isa["header"]}"' for isa in ladder]
    lines.append("")
    lines += [f"extern const uattn_bucket_kernels {e};" for e in entries]
    lines += ["", "const uattn_bucket_kernels *const uattn_bucket_registry[] = {"]
    lines += [f"    &{e}," for e in entries]
    if not entries:
        lines.append("    0,")
    lines += ["};", f"const size_t uattn_bucket_registry_size = {len(entries)};", ""]
    lines += ["const uattn_isa uattn_isa_registry[] = {"]
    for isa in ladder:
        shares, decodes = (f'"{isa[k]}"' if isa[k] else "NULL" for k in ("shares", "decodes"))
        twin = f'&{isa["twin"]}, {isa["twin_probe"]}' if isa.get("twin") else "NULL, NULL"
        lines.append(f'    {{"{isa["name"]}", &{isa["set"]}, {isa["probe"] or "NULL"}, {shares}, {decodes}, {twin}}},')
    lines += ["};", f"const size_t uattn_isa_registry_size = {len(ladder)};", ""]
    return "\n".join(lines)


def write_if_changed(path, text):
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except FileNotFoundError:
        pass
    with open(path, "w") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--manifest", default=MANIFEST, help="the ISAs and default buckets (default: gen/manifest.json)")
    ap.add_argument("--default-buckets", action="store_true", help="print the manifest's default bucket list")
    ap.add_argument("--buckets", help="DTYPES:BLOCK_SIZES:HEAD_DIMS:CHUNK_SIZES groups")
    ap.add_argument("--list", action="store_true", help="print the sources it would write")
    ap.add_argument("--out", help="the directory to write them to")
    args = ap.parse_args()
    try:
        manifest = load_manifest(args.manifest)
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"gen/generate.py: {args.manifest}: {e}")
    if args.default_buckets:
        print(default_buckets(manifest))
        return
    if args.buckets is None:
        sys.exit("gen/generate.py: give --default-buckets, or --buckets SPEC with --list or --out DIR")
    try:
        buckets = parse(args.buckets, manifest["dtypes"])
    except ValueError as e:
        sys.exit(f"gen/generate.py: UATTN_KERNEL_BUCKETS: {e}")
    sources = [source_name(b, isa) for b, isa in pairs(manifest, buckets)] + ["registry.c"]
    if args.list:
        print("\n".join(sources))
        return
    if not args.out:
        sys.exit("gen/generate.py: give --list or --out DIR")
    os.makedirs(args.out, exist_ok=True)
    for b, isa in pairs(manifest, buckets):
        write_if_changed(os.path.join(args.out, source_name(b, isa)), bucket_source(manifest, b, isa))
    write_if_changed(os.path.join(args.out, "registry.c"), registry_source(manifest, buckets))


if __name__ == "__main__":
    main()
