"""Before/after the graph passes: kernels, planned arena and step time for the benchmark workloads.

    python -m benchmarks.fusion [--workloads tensor_mlp,gpt] [--seconds 1.0]

Each workload is built once per configuration (the passes switched off with
BURJIT_DISABLE_PASSES, exactly as a user would debug) on the default backend; the kernel count
is read from the graph each compile hands to the backend. Run pinned to one thread (the
benchmarks' worker environment) for numbers comparable with benchmarks.run.
"""

import argparse
import os
import time

from burjit.jit import default_backend
from burjit.passes import pipeline

from . import measure, workloads
from .frameworks import Burjit

CONFIGS = {"no passes": "simplify,fuse,schedule,memplan", "no fusion": "fuse", "all passes": ""}
DTYPES = {"expression": "float64"}


def _recording(seen):
    """pipeline.run that also keeps the graph it returns (the backend's input)."""
    run = pipeline.run

    def recorded(graph, names=None):
        seen.append(run(graph, names))
        return seen[-1]
    return recorded


def build(name, disabled):
    """(bench, kernels, arena bytes, compile seconds) of one workload with some passes off."""
    mod = workloads.get(name)
    dtype = DTYPES.get(name, "float32")
    fw = Burjit()
    fw.load(dtype)
    seen, run = [], pipeline.run
    os.environ["BURJIT_DISABLE_PASSES"] = disabled
    pipeline.run = _recording(seen)
    try:
        bench = mod.make(mod.cases(True)[0], dtype).build(fw)
        t = time.perf_counter()
        bench.step()  # traces, runs the passes, compiles
        compile_s = time.perf_counter() - t
    finally:
        pipeline.run, os.environ["BURJIT_DISABLE_PASSES"] = run, ""
    graph = pipeline.prepare(seen[-1])
    return bench, len(graph.meta["schedule"]), graph.meta["memory"].arena_bytes, compile_s


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="expression,scalar_mlp,tensor_mlp,gpt")
    ap.add_argument("--seconds", type=float, default=0.3, help="time per measurement")
    ap.add_argument("--rounds", type=int, default=7, help="configurations alternate; each keeps its best round")
    opts = ap.parse_args(argv)
    print(f"backend: {default_backend()}")
    print(f"{'workload':12} {'passes':11} {'kernels':>8} {'arena':>11} {'compile':>9} {'step':>11}")
    for name in opts.workloads.split(","):
        built = {label: build(name, disabled) for label, disabled in CONFIGS.items()}
        calls = {label: max(1, int(opts.seconds / max(measure.per_call(b[0].step, 3), 1e-7)))
                 for label, b in built.items()}
        best = dict.fromkeys(built, float("inf"))
        for _ in range(opts.rounds):  # alternating, so load from other processes hits every configuration
            for label, (bench, *_) in built.items():
                best[label] = min(best[label], measure.per_call(bench.step, calls[label]))
        for label, (_, kernels, arena, compile_s) in built.items():
            print(f"{name:12} {label:11} {kernels:8d} {arena:9d} B {compile_s:8.2f}s {best[label] * 1e6:9.1f}us",
                  flush=True)


if __name__ == "__main__":
    main()
