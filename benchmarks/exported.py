"""BurTorch's exp1 (the `tiny` workload) as an exported library: from C, and from Python through burjit.load.

    python -m benchmarks.exported [--steps 10000000] [--calls 200000] [--rounds 3] [--out exported.json]

The value-and-gradient step is exported once (burjit.export); then, in alternating rounds,
fresh processes run it: a C program calling it `--steps` times in a loop (each call reads the
last result, as the `tiny` loop rows do) and timing itself, a Python process that only
`burjit.load()`s it, and one that compiles it with burjit.compile, for comparison. Each row
reports the median time per step and the whole process's peak RSS (VmHWM).
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import burjit

from .frameworks.burjit import straight_grad
from .workloads import tiny as exp1

TINY = f"{exp1.__name__}:{exp1.tiny.__name__}"  # the workload function, as straight_grad names it

C_LOOP = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include "tiny.h"
static long peak_rss(void) {  /* VmHWM: ru_maxrss would keep the forking parent's peak across exec */
    char line[256]; long kib = -1;
    FILE *f = fopen("/proc/self/status", "r");
    while (f && fgets(line, sizeof line, f)) if (strncmp(line, "VmHWM:", 6) == 0) kib = atol(line + 6);
    if (f) fclose(f);
    return kib * 1024;
}
int main(int argc, char **argv_) {
    long steps = atol(argv_[1]);
    static double x[2] = {-41.0, 2.0}, v, g[2];
    static _Alignas(64) unsigned char arena[TINY_ARENA_BYTES + 1];
    void *argv[] = {x, &v, g, arena};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < steps; i++) {
        if (tiny_step(argv)) return 1;
        x[0] += 0.0 * g[0];  /* the next step reads this one's result */
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%.17g %.17g %.17g %.17g %ld\n", ((t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec)) / steps,
           v, g[0], g[1], peak_rss());
    return 0;
}
"""

PY_CALLS = """
import sys, time, numpy as np, burjit
from benchmarks.measure import peak_bytes
kind, path, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
if kind == "load":
    step = burjit.load(path)
else:
    from benchmarks.exported import TINY
    from benchmarks.frameworks.burjit import straight_grad
    step = straight_grad(TINY, "float64")
x = np.array([-41.0, 2.0])
v, g = step(x)
t = time.perf_counter()
for _ in range(calls):
    v, g = step(x)
s = (time.perf_counter() - t) / calls
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"llvmlite", "networkx"})
print(s, float(v), g[0], g[1], peak_bytes(), ",".join(heavy) or "-")
"""


def run(args):
    tmp = Path(tempfile.mkdtemp(prefix="burjit-exported-"))
    burjit.export(straight_grad(TINY, "float64"), np.array([-41.0, 2.0]), path=tmp / "tiny")
    (tmp / "loop.c").write_text(C_LOOP)
    subprocess.run(["cc", "-O2", "-o", "loop", "loop.c", "tiny.so", "-Wl,-rpath,$ORIGIN"], cwd=tmp, check=True)
    root = str(Path(__file__).resolve().parent.parent)
    rows = {"C program (exported .so)": [], "Python, burjit.load only": [], "Python, burjit.compile": []}
    for _ in range(args.rounds):  # alternate: a noisy moment hits every row alike
        out = subprocess.run([str(tmp / "loop"), str(args.steps)], capture_output=True, text=True, check=True)
        s, v, ga, gb, rss = out.stdout.split()
        rows["C program (exported .so)"].append(dict(s=float(s), check=[float(v), float(ga), float(gb)],
                                                     peak_rss=int(rss), imports="-"))
        for kind, label in (("load", "Python, burjit.load only"), ("compile", "Python, burjit.compile")):
            out = subprocess.run([sys.executable, "-c", PY_CALLS, kind, str(tmp / "tiny"), str(args.calls)],
                                 capture_output=True, text=True, check=True, cwd=root)
            s, v, ga, gb, rss, heavy = out.stdout.split()
            rows[label].append(dict(s=float(s), check=[float(v), float(ga), float(gb)], peak_rss=int(rss),
                                    imports=heavy))
    return [dict(row=label, us_per_step=1e6 * statistics.median(r["s"] for r in rs),
                 peak_rss=statistics.median(r["peak_rss"] for r in rs), check=rs[-1]["check"],
                 heavy_imports=rs[-1]["imports"], rounds=len(rs)) for label, rs in rows.items()]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10_000_000, help="steps of the C loop")
    ap.add_argument("--calls", type=int, default=200_000, help="calls in each Python process")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="exported.json")
    args = ap.parse_args(argv)
    rows = run(args)
    expected = [exp1.EXPECTED["value"][0]] + exp1.EXPECTED["grad"]
    print(f"{'exp1 step':28} {'us/step':>9} {'peak RSS':>10} {'llvmlite/networkx':>18}  check")
    for r in rows:
        ok = "ok" if r["check"] == expected else f"WRONG {r['check']}"
        print(f"{r['row']:28} {r['us_per_step']:9.4f} {r['peak_rss'] / 2**20:8.1f} MB {r['heavy_imports']:>18}  {ok}")
    Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
