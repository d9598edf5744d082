"""The workloads, each a module with `make(case, dtype) -> Grad | Train` and `cases(quick)`.

A workload's model is written once against a framework's numpy-like namespace `xp` (see
benchmarks/frameworks/) with the operators; every framework then runs the same numbers.
A module may also list `SKIP` (framework -> why not), `EXTRA` (frameworks run only here),
`EXPECTED` (published check values that every framework must reproduce), `DTYPES` (the dtypes
it runs in unless --dtype says otherwise; default float64), `LARGE` (cases run only with
--large) and `PUBLISHED` (published timings to quote beside ours).
"""

import importlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

NAMES = ("tiny", "exp1_pairs", "expression", "scalar_mlp", "scalar_values_mlp", "tensor_mlp", "gpt", "burtorch_gpt",
         "fastest_autograd")


def get(name):
    if name not in NAMES:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(NAMES)}")
    return importlib.import_module(f"{__name__}.{name}")


@dataclass
class Grad:
    """The value and gradient of f(xp, x) at the float vector x0: the scalar-graph pattern, no update."""
    f: Callable
    x0: np.ndarray

    def build(self, fw):
        return fw.grad(self.f, self.x0)

    def check(self, before, after):
        return after


@dataclass
class Train:
    """One SGD step of loss(xp, params, batch). The check is the loss and the gradient, read back
    from the update as (before - after) / lr, so a wrong gradient cannot hide behind a small lr."""
    loss: Callable
    params: dict
    batch: tuple
    lr: float
    own: dict = field(default_factory=dict)  # framework family -> () -> its own library's loss (burjit.nn),
    #                                          called only in that framework's worker: no peer imports it

    def build(self, fw):
        loss = self.own[fw.family]() if fw.family in self.own else self.loss
        return fw.sgd(loss, self.params, self.batch, self.lr)

    def check(self, before, after):
        return {"loss": after["loss"],
                **{f"grad {k}": (before[k] - after[k]) / self.lr for k in before if k != "loss"}}
