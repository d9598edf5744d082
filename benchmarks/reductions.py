"""Large float32 sums: time per call and error against float64, burjit beside numpy.

    python -m benchmarks.reductions [--sizes 1e5,1e6,1e7] [--seconds 0.2] [--rounds 5]

Each case is a sum over n uniform random numbers: of a vector (sum and mean), over axis 0 of a
tall (n/4, 4) and of a wide (n/1000, 1000) matrix, and the gradient of sum(x * w) for w of
shape (4,), whose backward pass sums the tall x over its long broadcast axis. Rounds alternate
between burjit and numpy (so load from other processes hits both) and each keeps its best.
The error is max |result - exact| / max |exact|, exact in float64; numpy sums a contiguous
axis pairwise and the other axes one row after another.
"""

import argparse

import numpy as np

import burjit
from burjit import ops as F

from . import measure

CASES = {  # name: (burjit function, numpy function, shape of x for n elements)
    "sum": (F.sum, np.sum, lambda n: (n,)),
    "mean": (F.mean, np.mean, lambda n: (n,)),
    "sum axis 0, 4 wide": (lambda x: F.sum(x, 0), lambda x: x.sum(0), lambda n: (n // 4, 4)),
    "sum axis 0, 1000 wide": (lambda x: F.sum(x, 0), lambda x: x.sum(0), lambda n: (n // 1000, 1000)),
    "grad of sum(x * w)": (lambda x: burjit.grad(lambda w: F.sum(x * w))(np.ones(4, np.float32)),
                           lambda x: x.sum(0), lambda n: (n // 4, 4)),
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e5,1e6,1e7", help="comma-separated element counts")
    ap.add_argument("--seconds", type=float, default=0.2, help="time per measurement")
    ap.add_argument("--rounds", type=int, default=5)
    opts = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"{'case':22} {'n':>9} {'burjit':>10} {'numpy':>10} {'burjit err':>11} {'numpy err':>10}")
    for n in (int(float(s)) for s in opts.sizes.split(",")):
        for name, (ours, theirs, shape) in CASES.items():
            x = rng.random(shape(n), dtype=np.float32)
            step = burjit.compile(ours)
            exact = theirs(x.astype(np.float64))
            fns = {"burjit": lambda: step(x), "numpy": lambda: theirs(x)}
            err = {k: np.max(np.abs(f() - exact)) / np.max(np.abs(exact)) for k, f in fns.items()}  # compiles
            calls = {k: max(1, int(opts.seconds / max(measure.per_call(f, 3), 1e-7))) for k, f in fns.items()}
            best = dict.fromkeys(fns, float("inf"))
            for _ in range(opts.rounds):
                for k, f in fns.items():
                    best[k] = min(best[k], measure.per_call(f, calls[k]))
            print(f"{name:22} {n:9.0e} {best['burjit'] * 1e6:8.1f}us {best['numpy'] * 1e6:8.1f}us "
                  f"{err['burjit']:11.1e} {err['numpy']:10.1e}", flush=True)


if __name__ == "__main__":
    main()
