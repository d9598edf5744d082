"""PyTorch, eager (`backward()`, in-place SGD) and `torch.compile` of `torch.func.grad_and_value`."""

from types import SimpleNamespace

import numpy as np

from .common import Bench, first_leaf, named_leaves, read_state, tree_map


class Torch:
    family = "torch"
    dtypes = ("float32", "float64")

    def __init__(self, name="torch", compiled=False):
        self.name, self.compiled = name, compiled

    def load(self, dtype):
        import torch
        torch.set_num_threads(1)
        torch.set_num_interop_threads(1)
        self.torch = torch
        nnf = torch.nn.functional
        red = lambda op: lambda x, axis=None, keepdims=False: (  # noqa: E731
            op(x) if axis is None else op(x, axis, keepdim=keepdims))
        self.xp = SimpleNamespace(
            relu=torch.relu, exp=torch.exp, log=torch.log, tanh=torch.tanh, sqrt=torch.sqrt,
            softplus=nnf.softplus, sum=red(torch.sum), mean=red(torch.mean), max=red(torch.amax),
            softmax=lambda x, axis=-1: torch.softmax(x, axis),
            where=lambda c, a, b: torch.where(torch.as_tensor(c), a, b),
            transpose=lambda x, axes: x.permute(*axes), reshape=torch.reshape,
            cross_entropy=nnf.cross_entropy, unstack=lambda x: list(x.unbind(0)))
        return torch.__version__

    def _t(self, a):
        return self.torch.from_numpy(np.array(a))

    def grad(self, f, x0):
        torch, out = self.torch, {}
        if self.compiled:
            fn = torch.compile(torch.func.grad_and_value(lambda x: f(self.xp, x)))
            x = self._t(x0)

            def run():
                out["grad"], out["value"] = fn(x)
            trivial = torch.compile(lambda x: (x.reshape(-1)[0], x))
            return Bench(run, lambda: {k: v.numpy() for k, v in out.items()}, lambda: trivial(x))
        x = self._t(x0).requires_grad_()

        def run():
            x.grad = None
            value = f(self.xp, x)
            value.backward()
            out["value"], out["grad"] = value.detach(), x.grad
        return Bench(run, lambda: {k: v.numpy() for k, v in out.items()})

    def sgd(self, loss, params, batch, lr):
        torch = self.torch
        batch = tree_map(self._t, batch)
        if self.compiled:
            def train(p, b):
                g, value = torch.func.grad_and_value(lambda p: loss(self.xp, p, b))(p)
                return tree_map(lambda p, g: p - lr * g, p, g), value
            step = torch.compile(train)
            trivial = torch.compile(lambda p, b: (p, first_leaf(p).reshape(-1)[0]))
            state = {"p": tree_map(self._t, params), "loss": np.nan}

            def run():
                state["p"], state["loss"] = step(state["p"], batch)

            def poke():
                state["p"], _ = trivial(state["p"], batch)
            return Bench(run, lambda: read_state(state, _torch_numpy), poke)
        state = {"p": tree_map(lambda a: self._t(a).requires_grad_(), params), "loss": np.nan}
        leaves = list(named_leaves(state["p"]).values())

        def run():
            for p in leaves:
                p.grad = None
            value = loss(self.xp, state["p"], batch)
            value.backward()
            with torch.no_grad():
                for p in leaves:
                    p.sub_(p.grad, alpha=lr)
            state["loss"] = value.detach()
        return Bench(run, lambda: read_state(state, _torch_numpy))


def _torch_numpy(t):
    return t.detach().numpy() if hasattr(t, "detach") else t
