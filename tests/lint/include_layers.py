#!/usr/bin/env python3
"""lint.include_layers: no include runs upward (the floors of docs/architecture.md).

Every quoted #include of a source file in one of the library's folders must name a file of the
same folder or of a folder its floor may see (FLOORS below, the one table of it); the layers may
include only meshrt/export.h and the generated meshrt/version.h from the public surface, except
capi/, which implements it. A folder is the top-level one, or the subfolder listed in FLOORS
(backends/cuda, ...): the longest listed prefix wins. Includes of other libraries ("hwy/...") and
of a file beside the includer ("common.cuh") are not layer edges and are skipped.

Usage: include_layers.py <source root>            check; fails naming file, line and include
       include_layers.py <source root> --graph    print the include graph between folders
                                                  (includer -> included: count) and check
Exit status: 0 pass, 1 an include that runs upward or sideways (each named), an include of a
folder no floor lists, or fewer than MIN_INCLUDES layer edges found (the scan found nothing).
"""
import os
import re
import sys

# Each folder and the folders it may include (besides itself).
FLOORS = {
    "runtime": set(),
    "kernels": {"runtime"},
    "collectives": {"runtime"},
    "backends/mpi": {"collectives", "runtime"},
    "backends/cuda": {"kernels", "collectives", "runtime"},
    "dist": {"kernels", "collectives", "runtime"},
    "model": {"dist", "kernels", "collectives", "runtime"},
    "train": {"model", "dist", "kernels", "collectives", "runtime"},
    "plan": {"train", "model", "dist", "kernels", "collectives", "runtime"},
    "capi": {"model", "dist", "kernels", "collectives", "runtime"},
    "tools/cli": {"dist", "kernels", "collectives", "runtime"},
    "bench": {"tools/cli", "plan", "train", "model", "dist", "kernels", "collectives", "runtime",
              "backends/cuda"},
    # `meshrt plan`: above bench/ (--calibrate runs the block and collective benchmarks' engines,
    # --compare reads a sweep), beside tools/.
    "plan/command": {"tools/cli", "bench", "plan", "train", "model", "dist", "kernels",
                     "collectives", "runtime"},
    "tools": {"tools/cli", "bench", "plan", "train", "model", "dist", "kernels", "collectives",
              "runtime"},
}
PUBLIC_FOR_LAYERS = {"meshrt/export.h", "meshrt/version.h"}
SOURCES = (".h", ".hpp", ".cpp", ".cu", ".cuh", ".c")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
MIN_INCLUDES = 500  # today about 1,000 layer edges


def folder_of(path):
    """The FLOORS folder of a repository path, or None."""
    best = None
    for f in FLOORS:
        if path == f or path.startswith(f + "/"):
            if best is None or len(f) > len(best):
                best = f
    return best


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    root, graph_mode = sys.argv[1], "--graph" in sys.argv[2:]
    tops = {f.split("/")[0] for f in FLOORS}
    bad, edges, graph = [], 0, {}
    for top in sorted(tops):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith(SOURCES):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                src = folder_of(rel)
                if src is None:
                    continue
                with open(full, encoding="utf-8", errors="replace") as fh:
                    for no, line in enumerate(fh, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        inc = m.group(1)
                        if inc.startswith("meshrt/"):
                            if src != "capi" and inc not in PUBLIC_FOR_LAYERS:
                                bad.append(f"{rel}:{no}: includes \"{inc}\": only capi/ includes "
                                           f"the public API; a layer may include "
                                           f"{', '.join(sorted(PUBLIC_FOR_LAYERS))}")
                            continue
                        dst = folder_of(inc)
                        if dst is None:
                            if inc.split("/")[0] in tops:
                                bad.append(f"{rel}:{no}: includes \"{inc}\", in a folder no floor "
                                           f"lists: add it to FLOORS in {sys.argv[0]}")
                            continue
                        edges += 1
                        graph[(src, dst)] = graph.get((src, dst), 0) + 1
                        if dst != src and dst not in FLOORS[src]:
                            bad.append(f"{rel}:{no}: includes \"{inc}\": {src}/ may include "
                                       f"{', '.join(sorted(FLOORS[src] | {src}))}, not {dst}/ "
                                       f"(docs/architecture.md, Layers)")
    if graph_mode:
        for (src, dst), n in sorted(graph.items()):
            if src != dst:
                print(f"{src} -> {dst}: {n}")
    for b in bad:
        print(b)
    if edges < MIN_INCLUDES:
        print(f"only {edges} layer includes found (expected at least {MIN_INCLUDES}): is "
              f"{root} the source root?")
        return 1
    if bad:
        print(f"{len(bad)} include(s) against the floors")
        return 1
    print(f"lint.include_layers: {edges} includes in {len(FLOORS)} folders, none upward")
    return 0


if __name__ == "__main__":
    sys.exit(main())
