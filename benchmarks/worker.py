"""A worker process: builds one workload in one framework, then answers the runner's requests.

`python -m benchmarks.worker SPEC_JSON` (spec: workload, case, framework, dtype). Answers go out
one JSON line each on the original stdout; anything the framework prints goes to stderr (the
runner's log). Requests come one JSON line each on stdin: {"cmd": "time", "k": k} (seconds per
step over k steps), {"cmd": "overhead", "k": k} (seconds per call of the trivial step),
{"cmd": "loop", "k": k} (seconds per step of k steps inside one call of the framework's own
loop), {"cmd": "finish"} (memory figures, then exit). The first answer also says how long the
framework took to import (numpy, imported before, not included).

A process per (workload, framework) keeps one framework's imports, thread pools and heap out of
another's numbers, and lets the runner kill a measurement that outlives its time limit. The work
runs on a thread with a large stack: micrograd's backward recurses once per graph level.
"""

import json
import os
import sys
import threading
import time
import traceback

import numpy as np

from . import frameworks, measure, workloads


def serve(spec, send, requests):
    fw = frameworks.FRAMEWORKS[spec["framework"]]
    if spec["dtype"] not in fw.dtypes:
        return send(status="skipped", note=f"{spec['dtype']} not supported ({'/'.join(fw.dtypes)} only)")
    t0 = time.perf_counter()
    try:
        version = fw.load(spec["dtype"])
    except ImportError as e:
        return send(status="missing", note=f"cannot import: {e}")
    import_s = time.perf_counter() - t0
    work = workloads.get(spec["workload"]).make(spec["case"], spec["dtype"])
    import_peak = measure.peak_bytes()
    measure.reset_peak()
    base = measure.rss_bytes()
    t0 = time.perf_counter()
    try:
        bench = work.build(fw)
        before = bench.read()
        bench.step()
        after = bench.read()
    except frameworks.Skip as e:
        return send(status="skipped", note=str(e))
    first = time.perf_counter() - t0
    check = {k: np.asarray(v, dtype=np.float64).ravel().tolist() for k, v in work.check(before, after).items()}
    send(status="ready", version=version, import_s=import_s, first_call_s=first, check=check,
         has_trivial=bench.trivial is not None, has_loop=bench.loop is not None)
    warmed, loop_compile, before_loops = set(), [], []
    for line in requests:
        req = json.loads(line)
        if req["cmd"] == "time":
            send(s=measure.per_call(bench.step, req["k"]))
        elif req["cmd"] == "overhead":
            if "overhead" not in warmed:
                bench.trivial()
                warmed.add("overhead")
            send(s=measure.per_call(bench.trivial, req["k"]))
        elif req["cmd"] == "loop":
            if not loop_compile:  # the first loop call compiles it: one iteration, so that is its cost
                before_loops.append(measure.peak_bytes())  # the step's own figures leave the loops' builds out
                t = time.perf_counter()
                bench.loop(1)
                loop_compile.append(time.perf_counter() - t)
            if ("loop", req["k"]) not in warmed:  # burjit compiles a loop per trip count (JAX: once)
                bench.loop(req["k"])
                warmed.add(("loop", req["k"]))
            send(s=measure.per_call(lambda: bench.loop(req["k"]), 1) / req["k"])
        elif req["cmd"] == "finish":
            loops_peak = measure.peak_bytes()
            peak = before_loops[0] if before_loops else loops_peak
            return send(peak_rss=max(peak, import_peak), peak_rss_delta=peak - base, loop_peak_rss=loops_peak,
                        end_rss_delta=measure.rss_bytes() - base, rss_base=base, arena_bytes=bench.arena(),
                        loop_compile_s=loop_compile[0] if loop_compile else None)


def main():
    spec = json.loads(sys.argv[1])
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(**answer):
        out.write(json.dumps(answer) + "\n")

    def guarded():
        try:
            serve(spec, send, sys.stdin)
        except BaseException as e:  # the runner records the failure; the traceback goes to the log
            traceback.print_exc()
            send(status="error", note=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300])

    sys.setrecursionlimit(10 ** 7)
    threading.stack_size(1 << 30)
    t = threading.Thread(target=guarded)
    t.start()
    t.join()


if __name__ == "__main__":
    main()
