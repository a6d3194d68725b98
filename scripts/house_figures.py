"""The house's figures, from the imports: modules, imports, floors, imports running back up, loops.

Usage: ``PYTHONPATH=. python scripts/house_figures.py [PACKAGE ...]`` (default: the whole
distribution: ftlayer serialization partitioners runtime). The graph is import-linter's (grimp),
the same one the contracts in pyproject.toml are checked against, so lazy imports inside
functions count too.

- rooms: modules (a package's ``__init__`` is one), lines beside them;
- arrows: imports between them (each pair once);
- floors: the longest chain of imports, loops taken as one room;
- in loops: imports between modules of one loop (whatever the floors, some of them run back up);
- loops: groups of modules that import each other in a circle.
"""

from __future__ import annotations

import sys
from pathlib import Path

import grimp

DISTRIBUTION = ("ftlayer", "serialization", "partitioners", "runtime")


def _loops(nodes: set[str], edges: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components (Tarjan), iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []
    counter = 0
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            node, it = work[-1]
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                    break
                if nxt in on:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = set()
                    while True:
                        member = stack.pop()
                        on.discard(member)
                        comp.add(member)
                        if member == node:
                            break
                    out.append(comp)
    return out


def figures(packages: tuple[str, ...]) -> dict[str, int]:
    """The figures of the modules of ``packages``, counting only imports among them."""
    graph = grimp.build_graph(*DISTRIBUTION, cache_dir=None)
    nodes = {m for m in graph.modules if m.split(".")[0] in DISTRIBUTION and m.split(".")[0] in packages}
    edges = {m: {i for i in graph.find_modules_directly_imported_by(m) if i in nodes and i != m} for m in nodes}
    comps = _loops(nodes, edges)
    comp_of = {m: k for k, comp in enumerate(comps) for m in comp}
    floor: dict[int, int] = {}

    for k, comp in enumerate(comps):  # Tarjan hands out a loop after every loop it imports
        below = [floor[comp_of[i]] for m in comp for i in edges[m] if comp_of[i] != k]
        floor[k] = 1 + max(below, default=0)
    arrows = sum(len(v) for v in edges.values())
    in_loops = sum(1 for m in nodes for i in edges[m] if comp_of[i] == comp_of[m])
    lines = sum(len(path.read_text().splitlines()) for package in packages for path in Path(package).rglob("*.py"))
    return {"rooms": len(nodes), "lines": lines, "floors": max(floor.values(), default=0), "arrows": arrows,
            "in loops": in_loops, "loops": sum(1 for c in comps if len(c) > 1)}


if __name__ == "__main__":
    pkgs = tuple(sys.argv[1:]) or DISTRIBUTION
    print(" ".join(pkgs), figures(pkgs))
