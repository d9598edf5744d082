"""The cost of calling a compiled step, beside a plain Python function called with the same arguments.

    python -m benchmarks.front_door [--seconds 0.2] [--rounds 7] [--out front_door.json]

Each case compiles a step that does (almost) no arithmetic, so its time is the front door: the
flatten, the checks, the output allocation, the native call and the rebuilt result. The plain
function takes the same arguments and returns them. Cases: one small array; micrograd's
expression step (value and gradient) on two numpy scalars; 100 numpy scalar arguments; the
parameters and batch of BurTorch's GPT (batch 1, float32), donated, as the benchmarks' `trivial`
call passes them. Cases alternate across rounds; each keeps its best round. Prints a table and
writes JSON.
"""

import argparse
import json

import numpy as np

import burjit
from burjit import ops as F

from . import measure, workloads
from .frameworks.common import first_leaf, tree_map


def _plain(*args):
    return args


def cases():
    """name -> (compiled call, plain call): closures over their arguments."""
    x = np.array([-41.0, 2.0])
    trivial = burjit.compile(lambda x: (F.reshape(x, (-1,))[0], x))
    a, b = np.float64(-4.0), np.float64(2.0)
    expression = burjit.compile(burjit.value_and_grad(lambda a, b: a * b + b ** 3.0, argnums=(0, 1)))
    scalars = [np.float64(i) for i in range(100)]
    total = burjit.compile(lambda *xs: sum(xs[1:], xs[0]))
    gpt = workloads.get("burtorch_gpt").make({"batch": 1}, "float32")
    state = {"p": tree_map(np.array, gpt.params)}
    poke = burjit.compile(lambda p, b: (p, F.reshape(first_leaf(p), (-1,))[0]), donate_argnums=0)

    def gpt_call():
        state["p"], _ = poke(state["p"], gpt.batch)
    return {"one array": (lambda: trivial(x), lambda: _plain(x)),
            "expression, 2 numpy scalars": (lambda: expression(a, b), lambda: _plain(a, b)),
            "100 numpy scalars": (lambda: total(*scalars), lambda: _plain(*scalars)),
            f"BurTorch GPT, {len(burjit.pytree.flatten((state['p'], gpt.batch))[0])} leaves, donated":
                (gpt_call, lambda: _plain(state["p"], gpt.batch))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=0.2, help="time per measurement")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    opts = ap.parse_args(argv)
    calls = {name: pair for name, pair in cases().items()}
    sizes = {}
    for name, pair in calls.items():
        for fn in pair:
            fn()  # compile, then settle the fast path
            fn()
        sizes[name] = [max(1, int(opts.seconds / max(measure.per_call(fn, 10), 1e-8))) for fn in pair]
    best = {name: [float("inf")] * 2 for name in calls}
    for _ in range(opts.rounds):
        for name, pair in calls.items():
            for j, fn in enumerate(pair):
                best[name][j] = min(best[name][j], measure.per_call(fn, sizes[name][j]))
    print(f"{'case':40} {'compiled':>10} {'plain':>9} {'more':>9} {'ratio':>7}")
    rows = []
    for name, (compiled, plain) in best.items():
        rows.append(dict(case=name, compiled_us=compiled * 1e6, plain_us=plain * 1e6,
                         more_us=(compiled - plain) * 1e6, ratio=compiled / plain))
        print(f"{name:40} {compiled * 1e6:8.3f}us {plain * 1e6:7.3f}us {(compiled - plain) * 1e6:7.3f}us "
              f"{compiled / plain:7.1f}")
    if opts.out:
        with open(opts.out, "w") as f:
            json.dump(dict(revision=measure.git_revision("."), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
