#!/usr/bin/python3
"""The layers of src/ call only downwards.

    test/check-layers.py [SRC_DIR]

Reads the built objects (src/*.o: which C file defines and which uses each
symbol, from `nm`) and the #include lines of src/*.c and src/*.h, and checks
the rule that src/common.h states:

  - a file uses (calls, reads) only symbols of its own layer or of layers
    below it, and includes only headers of its own layer or below;
  - entry points never use each other;
  - no two files of a layer use each other, directly or around a circle.

Prints one TAP line per rule ("ok N - ..." or "not ok N - ...", with the
offending uses) and exits non-zero when one fails.
"""

import fnmatch
import os
import re
import subprocess
import sys

def read_layers(src):
    """The layer list of src/common.h: "layers:", then "<layer> <pattern>..." lines."""
    layers, order = {}, []
    in_list = False
    for line in open(os.path.join(src, "common.h")):
        text = line.strip().lstrip("*").strip()
        if text == "layers:":
            in_list = True
            continue
        if in_list:
            if not text:
                break
            layer, *patterns = text.split()
            if layer not in layers:
                layers[layer] = []
                order.append(layer)
            layers[layer] += patterns
    order.reverse()  # the list is from the top; ranks count from the bottom
    return layers, order


def layers_of(layers, filename):
    """The layers whose patterns match filename (one, in a sound list)."""
    return [layer for layer, patterns in layers.items()
            if any(fnmatch.fnmatch(filename, p) for p in patterns)]


def nm(path, *flags):
    out = subprocess.run(["nm", *flags, path], capture_output=True, text=True, check=True).stdout
    return [line.split()[-1] for line in out.splitlines() if line.strip()]


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "src")
    layers, ORDER = read_layers(src)
    RANK = {layer: i for i, layer in enumerate(ORDER)}
    files = sorted(f for f in os.listdir(src) if f.endswith((".c", ".h")))
    placed = {f: layers_of(layers, f) for f in files}
    # a C file is named by its object (begin_funcs), a header by its file name
    LAYER_OF = {(f[:-2] if f.endswith(".c") else f): found[0]
                for f, found in placed.items() if len(found) == 1}
    objects = sorted(f[:-2] for f in os.listdir(src) if f.endswith(".o"))
    sources = sorted(f[:-2] for f in files if f.endswith(".c"))
    failures = []

    unplaced = [f"{f}: in no layer" for f, found in placed.items() if not found] + \
        [f"{f}: in {' and '.join(found)}" for f, found in placed.items() if len(found) > 1]
    failures.append(("every file of src/ has one layer", unplaced))
    missing = [s for s in sources if s not in objects]

    # which object defines each symbol (globals only: functions and variables)
    defined = {}
    for o in objects:
        for sym in nm(os.path.join(src, o + ".o"), "--defined-only", "--extern-only"):
            defined[sym] = o
    uses = {o: sorted({defined[s] for s in nm(os.path.join(src, o + ".o"), "--undefined-only")
                       if s in defined and defined[s] != o})
            for o in objects}

    bad = []
    for o in objects:
        for p in uses[o]:
            lo, lp = LAYER_OF.get(o), LAYER_OF.get(p)
            if lo is None or lp is None:
                continue
            if RANK[lp] > RANK[lo]:
                bad.append(f"{o}.c ({lo}) uses {p}.c ({lp}), a layer above it")
            elif lo == "entry" and lp == "entry":
                bad.append(f"{o}.c uses {p}.c: entry points never use each other")
    failures.append(("no file uses a file of a layer above it, no entry point another", bad))

    # no circle among the files of one layer
    circles = []
    for layer in ORDER:
        members = [o for o in objects if LAYER_OF.get(o) == layer]
        graph = {o: [p for p in uses[o] if p in members] for o in members}
        state = {}

        def visit(node, path):
            state[node] = "open"
            for nxt in graph[node]:
                if state.get(nxt) == "open":
                    circles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
                elif nxt not in state:
                    visit(nxt, path + [nxt])
            state[node] = "done"

        for node in members:
            if node not in state:
                visit(node, [node])
    failures.append(("no circle of uses among the files of a layer", circles))

    # includes point downwards too, and the headers form no circle
    wrong = []
    includes = {}
    for f in sorted(os.listdir(src)):
        if not f.endswith((".c", ".h")):
            continue
        name = f[:-2] if f.endswith(".c") else f
        text = open(os.path.join(src, f)).read()
        includes[f] = re.findall(r'^#include "([^"]+)"', text, re.M)
        for h in includes[f]:
            if h not in LAYER_OF or name not in LAYER_OF:
                continue
            if RANK[LAYER_OF[h]] > RANK[LAYER_OF[name]]:
                wrong.append(f"{f} ({LAYER_OF[name]}) includes {h} ({LAYER_OF[h]})")
    seen = {}

    def header_circle(h, path):
        seen[h] = "open"
        for nxt in includes.get(h, []):
            if seen.get(nxt) == "open":
                wrong.append("circle of includes: " + " -> ".join(path + [nxt]))
            elif nxt not in seen:
                header_circle(nxt, path + [nxt])
        seen[h] = "done"

    for h in includes:
        if h.endswith(".h") and h not in seen:
            header_circle(h, [h])
    failures.append(("includes point downwards, and form no circle", wrong))
    if missing:
        failures.append(("every C file was built", [f"{m}.c has no {m}.o" for m in missing]))

    failed = 0
    for i, (what, problems) in enumerate(failures, 1):
        if problems:
            failed += 1
            print(f"not ok {i} - {what}")
            for p in problems:
                print(f"#   {p}")
        else:
            print(f"ok {i} - {what}")
    print(f"1..{len(failures)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
