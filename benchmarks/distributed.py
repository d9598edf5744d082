"""Data-parallel training throughput on MPI, and the per-step cost of each way of running pmean.

    python -m benchmarks.distributed [--ranks 2] [--seconds 3] [--rounds 3] [--out distributed.json]

For burtorch_gpt (batch 64, float32) and tensor_mlp (batch 32, float32), every rank trains
with `burjit.distributed.train_step` (its shard's gradients, one pmean, SGD: one compiled step)
under `mpiexec -n k`, in these configurations, alternating within each round:
    k=1 native   one rank (its allreduce a no-op over one process)
    k=N native   phase 2: the native step calls MPI_Allreduce itself
    k=N host     phase 1: $BURJIT_COLLECTIVES=host, the step split at pmean, the allreduce between
    k=N none     the same step with pmean removed (each rank trains alone): the baseline
Reports global samples per second (best round), the speed-up over one rank, the time per step,
and the collective's cost per step: the step's time minus the `none` step's at the same k (the
allreduce, packing and unpacking, and the wait for the slower rank). Needs `pip install -e ".[mpi]"`.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

WORKLOADS = (("burtorch_gpt", {"batch": 64}), ("tensor_mlp", {"batch": 32}))


def configurations(ranks):
    return ((1, "native"), (ranks, "native"), (ranks, "host"), (ranks, "none"))


def worker(name, case, mode, seconds):
    """Under mpiexec: train until `seconds` pass; rank 0 prints one JSON line."""
    from burjit import distributed as dist
    from burjit import optim
    from burjit.pytree import tree_map

    from . import workloads
    from .frameworks.burjit import Burjit
    dist.init()
    if mode == "none":  # the baseline: train_step looks pmean up in its module at trace time
        dist.pmean = lambda tree: tree
    fw = Burjit()
    fw.load("float32")
    work = workloads.get(name).make(case, "float32")
    loss = work.own[fw.family]() if fw.family in work.own else work.loss
    opt = optim.sgd(work.lr)
    train = dist.train_step(lambda p, *b: loss(fw.xp, p, b), opt)
    params = dist.broadcast(tree_map(np.array, work.params))
    state = opt.init(params)
    for _ in range(3):  # compile and warm up
        params, state, _ = train(params, state, *work.batch)
    comm, steps = dist.comm(), 0
    comm.Barrier()
    start = time.perf_counter()
    while True:
        params, state, _ = train(params, state, *work.batch)
        steps += 1
        # every rank stops at the same step: rank 0's clock decides
        if steps % 8 == 0 and comm.bcast(time.perf_counter() - start > seconds, root=0):
            break
    elapsed = time.perf_counter() - start
    if dist.rank() == 0:
        print(json.dumps({"samples_per_s": steps * len(work.batch[0]) / elapsed, "step_s": elapsed / steps,
                          "steps": steps}))


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
    ap.add_argument("--worker", nargs=3, metavar=("NAME", "CASE", "MODE"), help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    if opts.worker:
        name, case, mode = opts.worker
        return worker(name, json.loads(case), mode, opts.seconds)
    best = {}
    for _ in range(opts.rounds):
        for name, case in WORKLOADS:
            for k, mode in configurations(opts.ranks):
                cmd = [_mpiexec(), "-n", str(k), sys.executable, "-m", "benchmarks.distributed", "--seconds",
                       str(opts.seconds), "--worker", name, json.dumps(case), mode]
                env = dict(os.environ, BURJIT_COLLECTIVES="host" if mode == "host" else "native")
                done = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
                got = json.loads(done.stdout.strip().splitlines()[-1])
                key = (name, k, mode)
                if key not in best or got["samples_per_s"] > best[key]["samples_per_s"]:
                    best[key] = got
    print(f"{'workload':28} {'ranks':>5} {'pmean':>7} {'samples/s':>12} {'x 1 rank':>9} {'step':>10} {'pmean cost':>11}")
    rows = []
    for (name, k, mode), got in best.items():
        case = dict(WORKLOADS)[name]
        speedup = got["samples_per_s"] / best[(name, 1, "native")]["samples_per_s"]
        cost = None if k == 1 or mode == "none" else got["step_s"] - best[(name, k, "none")]["step_s"]
        shown = "" if cost is None else f"{cost * 1e6:>9.1f}us"
        print(f"{name + ' batch=' + str(case['batch']):28} {k:>5} {mode:>7} {got['samples_per_s']:>12.0f} "
              f"{speedup:>9.2f} {got['step_s'] * 1e6:>8.0f}us {shown:>11}")
        rows.append(dict(workload=name, case=case, ranks=k, collectives=mode, speedup=speedup,
                         collective_s=cost, **got))
    if opts.out:
        with open(opts.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
