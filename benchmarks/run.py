"""`python -m benchmarks`: burjit and its peers, side by side, on every workload, in one run.

For each workload case the runner starts one worker process per framework (see worker.py),
with empty compilation caches of its own, lets each import its framework, build its step and
take its first step (the "cold compile" figure), compares every framework's values and
gradients (check.py) and times only those that agree. Timing alternates: each round asks every
worker in turn for k back-to-back steps, so machine noise falls on all frameworks alike; the
figure is the median over rounds of the time per step. Per-call overhead is timed the same way
on a compiled function with the step's own arguments and results and no arithmetic, and, for a
framework with a loop of its own (JAX's fori_loop), the time per step of k steps in one call.
Then a second fresh process per compiling framework builds the same step from the caches the
first one filled (the "warm compile" figure; its check values must match the first's). Every
request has a time limit; a worker that outlives it is killed and its row says "timeout".
Results: a table on stdout, results.json and results.png under --out, and optionally the
Markdown for benchmarks/RESULTS.md.
"""

import argparse
import datetime
import json
import os
import platform
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import check, frameworks, measure, report, workloads

ROOT = Path(__file__).resolve().parent.parent


MIN_ROUNDS = 3


class WorkerFailed(Exception):
    pass


class Worker:
    """One worker process and its request/answer pipe, every answer awaited with a time limit."""

    def __init__(self, spec, env, log_path):
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.worker", json.dumps(spec)],
                                     cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True)

    def ask(self, timeout, **request):
        if request:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.close()
            raise TimeoutError(f"no answer within {timeout:g} s")
        line = self.proc.stdout.readline()
        if not line:
            self.close()
            raise WorkerFailed(f"worker died (exit {self.proc.wait()}); see {self.log_path}")
        answer = json.loads(line)
        if answer.get("status") == "error":
            self.close()
            raise WorkerFailed(answer["note"])
        return answer

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.log.close()


def label(name, case):
    return " ".join([name] + [f"{k}={v}" for k, v in case.items()])


def cache_env(env, cache):
    """`env` with every framework's compilation cache in the directory `cache` (JAX's persistent
    cache switched on for every compile, however quick, so a warm start can use it; mlx.compile
    keeps its kernels under $TMPDIR/mlx, so TMPDIR is there too, with TensorFlow's litter)."""
    os.makedirs(cache, exist_ok=True)  # TMPDIR must exist (mlx fails on a missing one)
    return {**env, "BURJIT_CACHE_DIR": os.path.join(cache, "burjit"),
            "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache, "torchinductor"),
            "JAX_COMPILATION_CACHE_DIR": os.path.join(cache, "jax"),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "TMPDIR": cache}


def start(spec, env, log_path, timeout):
    """A worker that has built its step and taken its first step, and its first answer; or None
    and what went wrong (a dict of row fields)."""
    worker = Worker(spec, env, log_path)
    try:
        answer = worker.ask(timeout)
    except (TimeoutError, WorkerFailed) as e:
        return None, {"status": "timeout" if isinstance(e, TimeoutError) else "error",
                      "note": f"build + first step: {e}"}
    if answer["status"] != "ready":
        worker.close()
        return None, {"status": answer["status"], "note": answer["note"]}
    return worker, answer


def run_case(name, case, dtype, names, opts, env, log_dir, cache_root, skip=None):
    """Rows (dicts) for one workload case, one per framework; `skip`: framework -> why not run it."""
    module = workloads.get(name)
    skip = {**getattr(module, "SKIP", {}), **(skip or {})}
    rows, live, envs = {}, {}, {}
    for fw in names:
        row = rows[fw] = {"workload": label(name, case), "framework": fw, "dtype": dtype, "status": "ok"}
        if fw in skip:
            row.update(status="skipped", note=skip[fw])
            continue
        tag = f"{label(name, case).replace(' ', '_')}-{fw}-{dtype}"
        envs[fw] = (cache_env(env, os.path.join(cache_root, tag)), log_dir / f"{tag}.log")
        spec = {"workload": name, "case": case, "framework": fw, "dtype": dtype}
        worker, answer = start(spec, *envs[fw], opts.timeout)
        if worker is None:
            row.update(answer)
            continue
        row.update(version=answer["version"], import_s=answer["import_s"], first_call_s=answer["first_call_s"])
        live[fw] = (worker, answer)
    verdicts = check.judge({fw: a["check"] for fw, (_, a) in live.items()}, dtype, getattr(module, "EXPECTED", None))
    for fw, reason in verdicts.items():
        if reason:
            rows[fw].update(status="wrong", note=f"check failed: {reason}")
            live.pop(fw)[0].close()
    _alternate(live, rows, "time", "step_s", opts)
    _alternate({fw: wa for fw, wa in live.items() if wa[1]["has_trivial"]}, rows, "overhead", "overhead_s", opts)
    _alternate({fw: wa for fw, wa in live.items() if wa[1]["has_loop"]}, rows, "loop", "loop_s", opts)
    for fw, (worker, answer) in live.items():
        if rows[fw]["status"] == "ok":  # not one that timed out or failed while being timed
            try:
                rows[fw].update(worker.ask(opts.timeout, cmd="finish"))
            except (TimeoutError, WorkerFailed) as e:
                rows[fw].update(note=f"memory figures lost: {e}")
        worker.close()
        if "step_s" in rows[fw] and answer["has_trivial"]:  # eager frameworks compile nothing
            rows[fw]["cold_compile_s"] = max(rows[fw]["first_call_s"] - rows[fw]["step_s"], 0.0)
            _warm_start(rows[fw], {"workload": name, "case": case, "framework": fw, "dtype": dtype},
                        answer["check"], envs[fw], opts)
    return list(rows.values())


def _warm_start(row, spec, cold_check, env_log, opts):
    """Warm compile: a fresh process builds the step from the caches the first one filled."""
    env, log_path = env_log
    worker, answer = start(spec, env, log_path.with_suffix(".warm.log"), opts.timeout)
    if worker is None:
        row["note"] = f"warm start: {answer['status']}: {answer['note']}"
        return
    worker.close()
    reason = check.disagreement(answer["check"], cold_check, check.RTOL[spec["dtype"]])
    if reason:
        row.update(status="wrong", note=f"the warm (cached) build computes differently: {reason}")
    row["warm_compile_s"] = max(answer["first_call_s"] - row["step_s"], 0.0)
    row["import_s"] = min(row["import_s"], answer["import_s"])


def _alternate(live, rows, cmd, key, opts):
    """Median seconds per call over opts.rounds rounds, each round visiting every worker in turn.

    A framework whose steps are slow stops early, after MIN_ROUNDS rounds, once it has spent
    opts.budget seconds: a 2 s step does not need seven samples to be told from a 20 us one."""
    ks, samples = {}, {fw: [] for fw in live}
    for r in range(opts.rounds + 1):  # round 0 calibrates k so that a round takes about opts.round_time
        order = list(live)[r % max(len(live), 1):] + list(live)[:r % max(len(live), 1)]
        for fw in order:
            worker, _ = live[fw]
            spent = sum(samples[fw]) * ks.get(fw, 1)
            if worker.proc.poll() is not None or (len(samples[fw]) >= MIN_ROUNDS and spent > opts.budget):
                continue
            try:
                s = worker.ask(opts.timeout, cmd=cmd, k=ks.get(fw, 1))["s"]
            except (TimeoutError, WorkerFailed) as e:
                rows[fw].update(status="timeout" if isinstance(e, TimeoutError) else "error", note=f"{cmd}: {e}")
                continue
            if r == 0:
                ks[fw] = max(1, int(opts.round_time / max(s, 1e-9)))
            if r > 0 or ks[fw] == 1:  # a calibration of one step that stays at one step is a sample
                samples[fw].append(s)
    for fw in list(live):
        if rows[fw]["status"] != "ok":
            live.pop(fw)
        elif samples[fw]:
            rows[fw].update({key: statistics.median(samples[fw]), key + "_min": min(samples[fw]),
                             key.replace("_s", "_k"): ks[fw]})


def add_ratios(rows):
    """ratio = framework's time per step / burjit's, within the same case and dtype."""
    base = {(r["workload"], r["dtype"]): r["step_s"] for r in rows
            if r["framework"] == "burjit" and r.get("step_s")}
    for r in rows:
        b = base.get((r["workload"], r["dtype"]))
        if b and r.get("step_s"):
            r["ratio"] = r["step_s"] / b


def parse(argv):
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small cases, few short rounds (a dev run)")
    ap.add_argument("--only", default=",".join(workloads.NAMES),
                    help=f"comma-separated workloads (default all: {','.join(workloads.NAMES)})")
    ap.add_argument("--frameworks", default=None,
                    help="comma-separated frameworks (default: " + ",".join(frameworks.DEFAULT)
                    + " plus each workload's extras)")
    ap.add_argument("--dtype", choices=("float64", "float32", "both"), default=None,
                    help="run every workload in this dtype (default: each workload's own, float64 unless it says)")
    ap.add_argument("--large", action="store_true", help="also the workloads' large cases (fastest_autograd n=100000 and n=1000000)")
    ap.add_argument("--timeout", type=float, default=None, help="seconds allowed per request (default 60, quick 45)")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds (default 7, quick 3)")
    ap.add_argument("--round-time", type=float, default=None, help="seconds per framework per round (0.2, quick 0.03)")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds of steps after which a slow framework stops early (default 20, quick 5)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--markdown", type=Path, default=None,
                    help="also write this Markdown report (RESULTS.md) and its plot beside it (RESULTS.png)")
    ap.add_argument("--keep-openblas-tuning", action="store_true",
                    help="keep OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE in the workers (dropped by default)")
    opts = ap.parse_args(argv)
    opts.timeout = opts.timeout or (45.0 if opts.quick else 60.0)
    opts.rounds = opts.rounds or (3 if opts.quick else 7)
    opts.round_time = opts.round_time or (0.03 if opts.quick else 0.2)
    opts.budget = opts.budget or (5.0 if opts.quick else 20.0)
    return opts


def run_all(names, chosen, opts, env, log_dir, cache_root):
    rows = []
    for name in names:
        module = workloads.get(name)
        fws = chosen or list(frameworks.DEFAULT) + list(getattr(module, "EXTRA", ()))
        for dtype in dtypes(module, opts.dtype):
            gave_up = {}  # a framework that timed out on a case is not tried on the larger ones
            for case in module.cases(opts.quick) + (getattr(module, "LARGE", []) if opts.large else []):
                print(f"-- {label(name, case)} [{dtype}]", file=sys.stderr, flush=True)
                done = run_case(name, case, dtype, fws, opts, env, log_dir, cache_root, gave_up)
                gave_up.update({r["framework"]: f"timed out at {r['workload']} already" for r in done
                                if r["status"] == "timeout"})
                rows += done
    add_ratios(rows)
    return rows


def dtypes(module, chosen):
    if chosen is None:
        return getattr(module, "DTYPES", ("float64",))
    return ("float64", "float32") if chosen == "both" else (chosen,)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    opts = parse(argv)
    names = [n.strip() for n in opts.only.split(",") if n.strip()]
    for n in names:
        workloads.get(n)
    chosen = opts.frameworks and [f.strip() for f in opts.frameworks.split(",") if f.strip()]
    unknown = set(chosen or ()) - set(frameworks.FRAMEWORKS)
    if unknown:
        raise SystemExit(f"unknown frameworks {sorted(unknown)}; known: {', '.join(frameworks.FRAMEWORKS)}")
    log_dir = opts.out / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    env = measure.worker_env(opts.keep_openblas_tuning)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    started, revision = time.time(), measure.git_revision(ROOT)
    with tempfile.TemporaryDirectory(prefix="burjit-bench-cache-") as cache_root:
        rows = run_all(names, chosen, opts, env, log_dir, cache_root)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python -m benchmarks"] + argv),
        "revision": revision, "cpu": measure.cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
        "numpy": _numpy_version(), "threads": 1, "wall_s": round(time.time() - started, 1),
        "openblas_tuning": {v: os.environ.get(v) for v in measure.OPENBLAS_TUNING if os.environ.get(v)},
        "openblas_tuning_kept": opts.keep_openblas_tuning,
        "quick": opts.quick, "rounds": opts.rounds, "round_time_s": opts.round_time, "timeout_s": opts.timeout,
        "versions": {r["framework"]: r["version"] for r in rows if r.get("version")},
        "workloads": {n: " ".join(workloads.get(n).__doc__.split("\n\n")[0].split()) for n in names},
        "published": {n: workloads.get(n).PUBLISHED for n in names if hasattr(workloads.get(n), "PUBLISHED")},
    }
    print(report.table(meta, rows))
    report.write_json(opts.out / "results.json", meta, rows)
    wrote = [opts.out / "results.json"] + [opts.out / "results.png"] * report.plot(opts.out / "results.png", rows)
    if opts.markdown:
        picture = opts.markdown.with_suffix(".png")
        drawn = report.plot(picture, rows)
        opts.markdown.write_text(report.markdown(meta, rows, picture.name if drawn else None))
        wrote += [opts.markdown] + [picture] * drawn
    print("wrote " + ", ".join(str(p) for p in wrote), file=sys.stderr)
    return rows


def _numpy_version():
    import numpy
    return numpy.__version__
