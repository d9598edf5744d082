"""MLX on the CPU (on Linux the `mlx[cpu]` wheel): eager `mx.value_and_grad`, and `mx.compile` of it.

MLX is lazy, so a call only records a graph: every timed step ends in `mx.eval` of its results.
Inputs go through `_array`: MLX makes float32 of a numpy float64 array unless told the dtype, and
indexes only with its own arrays (the workloads' embedding lookup).
"""

from types import SimpleNamespace

import numpy as np

from .common import Bench, first_leaf, read_state, tree_map


class MLX:
    family = "mlx"
    dtypes = ("float32", "float64")  # float64 runs on the CPU only, which is where this runs

    def __init__(self, name="mlx", compiled=False):
        self.name, self.compiled = name, compiled

    def load(self, dtype):
        import mlx.core as mx
        import mlx.nn as nn
        mx.set_default_device(mx.cpu)
        self.mx = mx
        red = lambda op: lambda x, axis=None, keepdims=False: op(x, axis=axis, keepdims=keepdims)  # noqa: E731
        self.xp = SimpleNamespace(
            relu=lambda x: mx.maximum(x, 0.0), exp=mx.exp, log=mx.log, tanh=mx.tanh, sqrt=mx.sqrt,
            softplus=lambda x: mx.logaddexp(x, 0.0), sum=red(mx.sum), mean=red(mx.mean), max=red(mx.max),
            softmax=lambda x, axis=-1: mx.softmax(x, axis=axis), where=lambda c, a, b: mx.where(mx.array(c), a, b),
            transpose=mx.transpose, reshape=mx.reshape,
            cross_entropy=lambda l, t: nn.losses.cross_entropy(l, t, reduction="mean"),
            unstack=lambda x: [x[i] for i in range(x.shape[0])])
        return mx.__version__

    def _array(self, a):
        a = np.asarray(a)
        return self.mx.array(a, dtype=getattr(self.mx, a.dtype.name))

    def _compile(self, fn):
        return self.mx.compile(fn) if self.compiled else fn

    def grad(self, f, x0):
        mx, out = self.mx, {}
        fn, x = self._compile(mx.value_and_grad(lambda x: f(self.xp, x))), self._array(x0)

        def run():
            out["value"], out["grad"] = fn(x)
            mx.eval(out)
        trivial = mx.compile(lambda x: (x.reshape(-1)[0], x)) if self.compiled else None
        return Bench(run, lambda: {k: np.array(v) for k, v in out.items()},
                     trivial and (lambda: mx.eval(trivial(x))))

    def sgd(self, loss, params, batch, lr):
        mx = self.mx

        def train(p, b):
            value, g = mx.value_and_grad(lambda p: loss(self.xp, p, b))(p)
            return tree_map(lambda p, g: p - lr * g, p, g), value
        step, batch = self._compile(train), tree_map(self._array, batch)
        state = {"p": tree_map(self._array, params), "loss": np.nan}

        def run():
            state["p"], state["loss"] = step(state["p"], batch)
            mx.eval(state)
        trivial = mx.compile(lambda p, b: (p, first_leaf(p).reshape(-1)[0])) if self.compiled else None

        def poke():
            state["p"], _ = trivial(state["p"], batch)
            mx.eval(state)
        return Bench(run, lambda: read_state(state, np.array), trivial and poke)
