#!/usr/bin/env python3
"""No two parts of the library need each other: the objects of a static library, linked by the symbols one
uses and another defines, form no cycle (ctest `link_cycles`).

    link_cycles.py LIBUATTN.a

A cycle is printed as its objects (archive members in order; several may share a basename, e.g. set.c.o of
each ISA, so each is also numbered) and the exit status is 1. Reads `nm` only; standard library only.
"""
import collections
import subprocess
import sys


def members(archive):
    """[(name, defined symbols, undefined symbols)] of each member, in archive order."""
    out = subprocess.run(["nm", archive], check=True, capture_output=True, text=True).stdout
    result = []
    for section in out.split("\n\n"):
        lines = [line for line in section.strip().split("\n") if line]
        if not lines or not lines[0].endswith(":"):
            continue
        defined, used = set(), set()
        for line in lines[1:]:
            fields = line.split()
            if len(fields) == 3 and fields[1] in "TDRBV":
                defined.add(fields[2])
            elif len(fields) == 2 and fields[0] == "U":
                used.add(fields[1])
        result.append((f"{lines[0][:-1]}#{len(result)}", defined, used))
    return result


def cycles(graph):
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph[nxt])))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    objs = members(sys.argv[1])
    owner = {sym: name for name, defined, _ in objs for sym in defined}
    graph = collections.defaultdict(set)
    for name, _, used in objs:
        graph[name] |= {owner[s] for s in used if s in owner and owner[s] != name}
    found = cycles({name: graph[name] for name, _, _ in objs})
    for c in found:
        print("cycle:", " <-> ".join(c))
    print(f"{len(objs)} objects, {len(found)} cycle(s)")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
