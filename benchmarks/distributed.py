"""Data-parallel training throughput: the same global batch on 1 rank and on N (MPI, phase 1).

    python -m benchmarks.distributed [--ranks 2] [--seconds 3] [--rounds 3] [--out distributed.json]

For burtorch_gpt (batch 64, float32) and tensor_mlp (batch 32, float32), each configuration runs
under `mpiexec -n k` (k = 1 and --ranks, alternating rounds): every rank computes the gradients
of its shard with one compiled step, `burjit.distributed.pmean` averages them between native
steps (one packed allreduce), and a donated compiled SGD step updates the parameters. Reports
global samples per second (best round), the speed-up over one rank, and the time per step in
pmean (packing, the allreduce, unpacking). Needs `pip install -e ".[mpi]"`.
"""

import argparse
import json
import subprocess
import sys
import time

import numpy as np

WORKLOADS = (("burtorch_gpt", {"batch": 64}), ("tensor_mlp", {"batch": 32}))


def worker(name, case, seconds):
    """Under mpiexec: train until `seconds` pass; rank 0 prints one JSON line."""
    from burjit import distributed as dist
    from burjit.pytree import tree_map

    from . import workloads
    from .frameworks.burjit import Burjit
    dist.init()
    fw = Burjit()
    fw.load("float32")
    work = workloads.get(name).make(case, "float32")
    loss = work.own[fw.family]() if fw.family in work.own else work.loss
    bj, xp, lr = fw.bj, fw.xp, work.lr
    grads = bj.compile(bj.value_and_grad(lambda p, b: loss(xp, p, b)))
    update = bj.compile(lambda p, g: tree_map(lambda p, g: p - lr * g, p, g), donate_argnums=0)
    params, part = dist.broadcast(tree_map(np.array, work.params)), dist.shard(work.batch)

    def step():
        _, g = grads(params, part)
        t0 = time.perf_counter()
        g = dist.pmean(g)
        return update(params, g), time.perf_counter() - t0
    for _ in range(3):  # compile and warm up
        params, _ = step()
    comm, steps, in_pmean = dist.comm(), 0, 0.0
    comm.Barrier()
    start = time.perf_counter()
    while True:
        params, dt = step()
        steps, in_pmean = steps + 1, in_pmean + dt
        # every rank stops at the same step: rank 0's clock decides
        if steps % 8 == 0 and comm.bcast(time.perf_counter() - start > seconds, root=0):
            break
    elapsed = time.perf_counter() - start
    if dist.rank() == 0:
        print(json.dumps({"samples_per_s": steps * len(work.batch[0]) / elapsed, "step_s": elapsed / steps,
                          "pmean_s": in_pmean / steps, "steps": steps}))


def _mpiexec():
    from burjit.distributed import launcher
    found = launcher()
    if found is None:
        sys.exit("no mpiexec: pip install -e \".[mpi]\"")
    return found


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", nargs=2, metavar=("NAME", "CASE"), help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    if opts.worker:
        return worker(opts.worker[0], json.loads(opts.worker[1]), opts.seconds)
    best = {}
    for _ in range(opts.rounds):
        for name, case in WORKLOADS:
            for k in (1, opts.ranks):
                cmd = [_mpiexec(), "-n", str(k), sys.executable, "-m", "benchmarks.distributed", "--seconds",
                       str(opts.seconds), "--worker", name, json.dumps(case)]
                done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                got = json.loads(done.stdout.strip().splitlines()[-1])
                key = (name, k)
                if key not in best or got["samples_per_s"] > best[key]["samples_per_s"]:
                    best[key] = got
    print(f"{'workload':28} {'ranks':>5} {'samples/s':>12} {'x 1 rank':>9} {'step':>10} {'in pmean':>10}")
    rows = []
    for (name, k), got in best.items():
        case = dict(WORKLOADS)[name]
        speedup = got["samples_per_s"] / best[(name, 1)]["samples_per_s"]
        print(f"{name + ' batch=' + str(case['batch']):28} {k:>5} {got['samples_per_s']:>12.0f} {speedup:>9.2f} "
              f"{got['step_s'] * 1e6:>8.0f}us {got['pmean_s'] * 1e6:>8.1f}us")
        rows.append(dict(workload=name, case=case, ranks=k, speedup=speedup, **got))
    if opts.out:
        with open(opts.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
