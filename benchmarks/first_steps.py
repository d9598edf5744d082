"""How soon training starts: the two first-step targets of compile cost that no table row shows.

    python -m benchmarks.first_steps [--rounds 3] [--out first_steps.json]

`batches`: in one fresh process with an empty cache, BurTorch's GPT SGD step (float32) is
called at batch 1 (the cold compile), then at batch 16 and 64: each new batch size is a new
step, whose kernels the earlier ones partly share. `gpt_char`: `examples/gpt_char.py` with its
defaults, from launching the process (interpreter start, imports, data, model) to the end
of its first training step, timed by the parent; the child stops there. Medians over rounds.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BATCHES = r"""
import json, time
from benchmarks.workloads import burtorch_gpt
from benchmarks.frameworks.burjit import Burjit
fw = Burjit()
fw.load("float32")
out = {}
for b in (1, 16, 64):
    bench = burtorch_gpt.make({"batch": b}, "float32").build(fw)
    t = time.perf_counter()
    bench.step()
    out[b] = time.perf_counter() - t
print(json.dumps(out))
"""

# Runs the example as `python examples/gpt_char.py` would, and ends the process once its first
# call of a compiled step returns (the first training step: the example compiles nothing before).
FIRST_STEP = r"""
import os, runpy, sys
import burjit.jit
call = burjit.jit.CompiledFunction.__call__
def first(self, *args, **kwargs):
    call(self, *args, **kwargs)
    print("first step done", flush=True)
    os._exit(0)
burjit.jit.CompiledFunction.__call__ = first
sys.argv = [sys.argv[1], "--checkpoint", sys.argv[2]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def batches():
    with tempfile.TemporaryDirectory() as cache:
        out = subprocess.run([sys.executable, "-c", BATCHES], env={**os.environ, "BURJIT_CACHE_DIR": cache},
                             check=True, capture_output=True, text=True, cwd=Path(__file__).parent.parent).stdout
    return {int(b): s for b, s in json.loads(out).items()}


def gpt_char(example):
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", FIRST_STEP, str(example), os.path.join(tmp, "ckpt.npz")],
                             env={**os.environ, "BURJIT_CACHE_DIR": tmp}, capture_output=True, text=True)
        seconds = time.perf_counter() - t
    if out.returncode or "first step done" not in out.stdout:
        raise RuntimeError(f"gpt_char.py ended before its first step:\n{out.stdout}{out.stderr}")
    return seconds


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    example = Path(__file__).resolve().parent.parent / "examples" / "gpt_char.py"
    runs = {"batches": [], "gpt_char": []}
    for _ in range(args.rounds):  # alternating, so a slow spell of the machine hits both
        runs["batches"].append(batches())
        runs["gpt_char"].append(gpt_char(example))
    med = {f"burtorch_gpt batch={b} float32, first call ({'cold' if b == 1 else 'after the batches before it'})":
           statistics.median(r[b] for r in runs["batches"]) for b in (1, 16, 64)}
    med["examples/gpt_char.py: launch to end of first step, cold cache"] = statistics.median(runs["gpt_char"])
    width = max(map(len, med))
    print(f"medians of {args.rounds} alternating rounds, each a fresh process")
    for name, s in med.items():
        print(f"{name:<{width}}  {s:.2f} s")
    if args.out:
        Path(args.out).write_text(json.dumps({"runs": runs, "medians": med}, indent=1))


if __name__ == "__main__":
    main()
