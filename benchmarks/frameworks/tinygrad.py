"""tinygrad: the step under TinyJit, which replays the kernels it captured on the first calls.

tinygrad's CPU device compiles its kernels with clang, so where no `clang` is on PATH the rows
are skipped with that note; setting tinygrad's own DEV (DEV=PYTHON: its slow Python emulator)
runs them there anyway, which checks this adapter's numbers but times nothing worth reporting.
A 0-d tensor is a constant in tinygrad, not a buffer that a jitted step can take or return, so
scalars travel as shape-(1,) tensors: `unstack` gives (1,) slices, the value and loss come out (1,).
"""

import os
import shutil
from types import SimpleNamespace

import numpy as np

from .common import Bench, Skip, first_leaf, leaves, read_state, tree_map, unflatten, version

NO_CLANG = "needs clang on PATH (tinygrad's CPU device compiles kernels with it)"


class Tinygrad:
    name = family = "tinygrad"
    dtypes = ("float32", "float64")

    def load(self, dtype):
        from tinygrad import Context, Device, Tensor, TinyJit
        from tinygrad.nn.optim import SGD
        self.Tensor, self.TinyJit, self.SGD, self.Context = Tensor, TinyJit, SGD, Context
        self.missing = None if shutil.which("clang") or os.environ.get("DEV") else NO_CLANG
        red = lambda op: lambda x, axis=None, keepdims=False: op(x, axis=axis, keepdim=keepdims)  # noqa: E731
        self.xp = SimpleNamespace(
            relu=Tensor.relu, exp=Tensor.exp, log=Tensor.log, tanh=Tensor.tanh, sqrt=Tensor.sqrt,
            softplus=Tensor.softplus, sum=red(Tensor.sum), mean=red(Tensor.mean), max=red(Tensor.max),
            softmax=lambda x, axis=-1: x.softmax(axis), where=lambda c, a, b: Tensor(c).where(a, b),
            transpose=lambda x, axes: x.permute(axes), reshape=lambda x, shape: x.reshape(shape),
            cross_entropy=lambda l, t: l.sparse_categorical_crossentropy(t),
            unstack=lambda x: [x[i:i + 1] for i in range(x.shape[0])])
        return f"{version('tinygrad')} ({'no device: ' + NO_CLANG if self.missing else Device.DEFAULT})"

    def _tensor(self, a):
        return self.Tensor(np.asarray(a)).realize()

    def grad(self, f, x0):
        if self.missing:
            raise Skip(self.missing)

        @self.TinyJit
        def step(x):
            value = f(self.xp, x).reshape(1)
            (g,) = value.sum().gradient(x)
            return value.realize(), g.realize()
        trivial = self.TinyJit(lambda x: (x.reshape(-1)[0:1].contiguous().realize(), x))
        x, out = self._tensor(x0), {}

        def run():
            out["value"], out["grad"] = step(x)
        return Bench(run, lambda: {k: v.numpy() for k, v in out.items()}, lambda: trivial(x))

    def sgd(self, loss, params, batch, lr):
        if self.missing:
            raise Skip(self.missing)
        p = tree_map(self._tensor, params)
        opt = self.SGD(leaves(p), lr=lr)
        flat, out = leaves(tree_map(self._tensor, batch)), {"loss": self.Tensor([np.nan])}

        @self.TinyJit
        def step(*b):
            with self.Context(TRAINING=1):  # the optimizer refuses to step otherwise
                opt.zero_grad()
                value = loss(self.xp, p, unflatten(batch, b)).backward()
                return value.reshape(1).realize(*opt.schedule_step())  # the loss before the update
        trivial = self.TinyJit(lambda *b: first_leaf(p).reshape(-1)[0:1].contiguous().realize())

        def run():
            out["loss"] = step(*flat)
        return Bench(run, lambda: read_state({"p": p, "loss": out["loss"].numpy()[0]}, lambda t: t.numpy()),
                     lambda: trivial(*flat))
