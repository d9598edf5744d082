"""micrograd: scalar Values in numpy object arrays."""

import math
from types import SimpleNamespace

import numpy as np

from .common import Bench, named_leaves, read_state, tree_map, version


class Micrograd:
    """micrograd's Value has + * ** relu; exp and log are added here in its own style for softplus."""
    name = family = "micrograd"
    dtypes = ("float64",)

    def load(self, dtype):
        from micrograd.engine import Value
        self.Value = Value

        def unary(fn, dfn):
            def op(v):
                out = Value(fn(v.data), (v,), fn.__name__)

                def backward():
                    v.grad += dfn(v.data, out.data) * out.grad
                out._backward = backward
                return out
            return np.frompyfunc(op, 1, 1)
        exp = unary(math.exp, lambda x, y: y)
        log = unary(math.log, lambda x, y: 1.0 / x)
        self.xp = SimpleNamespace(
            relu=np.frompyfunc(Value.relu, 1, 1), exp=exp, log=log, softplus=lambda x: log(1.0 + exp(x)),
            sum=lambda x, axis=None, keepdims=False: np.sum(x, axis=axis, keepdims=keepdims),
            mean=lambda x, axis=None, keepdims=False: (  # Value / numpy int would raise int ** -1
                np.sum(x, axis=axis, keepdims=keepdims) * (1.0 / (x.size if axis is None else x.shape[axis]))),
            reshape=np.reshape, unstack=list)
        return version("micrograd")

    def _values(self, a):
        return np.frompyfunc(lambda v: self.Value(float(v)), 1, 1)(np.asarray(a)).astype(object)

    def grad(self, f, x0):
        out = {}

        def run():
            x = list(self._values(x0))
            value = f(self.xp, x)
            value.backward()
            out["value"], out["grad"] = np.array(value.data), np.array([v.grad for v in x])
        return Bench(run, lambda: dict(out))

    def sgd(self, loss, params, batch, lr):
        data = np.frompyfunc(lambda v: v.data, 1, 1)
        state = {"p": tree_map(self._values, params), "loss": np.nan}
        values = [v for a in named_leaves(state["p"]).values() for v in a.ravel()]

        def run():
            for v in values:
                v.grad = 0.0
            value = loss(self.xp, state["p"], batch)
            value.backward()
            for v in values:
                v.data -= lr * v.grad
            state["loss"] = value.data
        return Bench(run, lambda: read_state(state, lambda a: data(a).astype(np.float64)))
