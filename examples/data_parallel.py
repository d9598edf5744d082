"""Data-parallel training on MPI: the same script on 1 process or N, the same numbers.

    python examples/data_parallel.py                    # one process (an MPI singleton)
    mpiexec -n 2 python examples/data_parallel.py       # 2 ranks, each on half of every batch
    mpiexec -n 3 python examples/data_parallel.py --resume --steps 200   # continue, on 3 ranks

Needs `pip install -e ".[mpi]"`. A small MLP fits a noisy sine surface in float64. Rank 0
makes the parameters and broadcasts them; every step (`distributed.train_step`, one compiled
native step) each rank computes the gradients of its shard of the global batch, `pmean`
averages them and the loss (one MPI_Allreduce called from the native code), and the same SGD
update runs everywhere, so the ranks stay bit-identical and train as one process does on the
whole batch. Rank 0 alone writes the checkpoint (atomically, burjit.nn.save); --resume reads it on
rank 0 and broadcasts it, so a job may resume on another number of ranks.
"""

import argparse

import numpy as np

from burjit import distributed as dist
from burjit import nn, optim
from burjit import ops as F

LAYERS = [nn.Linear(2, 32, dtype="float64"), nn.Linear(32, 1, dtype="float64")]


def loss_fn(p, x, y):
    return F.mean((LAYERS[1](p[1], F.tanh(LAYERS[0](p[0], x))) - y) ** 2.0)


def batch(step, size):
    """The global batch of a step, the same on every rank (seeded by the step)."""
    rng = np.random.default_rng(step)
    x = rng.uniform(-2, 2, (size, 2))
    return x, np.sin(x[:, :1] * x[:, 1:]) + 0.05 * rng.standard_normal((size, 1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=96, help="global batch: a multiple of the ranks")
    ap.add_argument("--checkpoint", default="data_parallel.npz")
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args(argv)
    dist.init()
    dist.abort_on_error()  # a rank that raises ends the job with its message instead of a hang
    opt = optim.sgd(0.05, momentum=0.9)
    start, state = 0, None
    if dist.rank() == 0:
        params = [layer.init(np.random.default_rng(i)) for i, layer in enumerate(LAYERS)]
        state = {"params": params, "opt": opt.init(params)}
        if args.resume:
            state, meta = nn.load(args.checkpoint, state)
            start = meta["step"]
    state, start = dist.broadcast((state, np.int64(start)))
    params, opt_state = state["params"], state["opt"]
    train = dist.train_step(loss_fn, opt)
    for step in range(int(start), int(start) + args.steps):
        params, opt_state, loss = train(params, opt_state, *batch(step, args.batch_size))
        if dist.rank() == 0 and (step == start or (step + 1) % 100 == 0):
            print(f"step {step + 1}: loss {float(loss):.6f} ({dist.size()} ranks)")
    if dist.rank() == 0:
        nn.save(args.checkpoint, {"params": params, "opt": opt_state}, meta={"step": int(start) + args.steps})
    return params


if __name__ == "__main__":
    main()
