"""burjit itself: `burjit.compile` of `value_and_grad`, the parameters donated to the SGD step;
and `burjit.load` of the same step exported (`python -m benchmarks.frameworks.burjit` exports it)."""

import importlib
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from .common import Bench, Skip, first_leaf, read_state, tree_map, version


class Burjit:
    family = "burjit"
    dtypes = ("float32", "float64")

    def __init__(self, name="burjit", backend=None):
        self.name, self.backend = name, backend

    def load(self, dtype):
        import burjit
        from burjit import ops as F
        from burjit.jit import default_backend
        for name in ("compile", "value_and_grad", "fori_loop"):  # burjit imports a name's module on first use:
            getattr(burjit, name)                                # here, not inside a timed first call
        self.bj = burjit
        self.xp = SimpleNamespace(
            relu=F.relu, exp=F.exp, log=F.log, tanh=F.tanh, sqrt=F.sqrt, softplus=F.softplus, sum=F.sum,
            mean=F.mean, max=F.max, softmax=F.softmax, where=F.where, transpose=F.transpose,
            reshape=F.reshape, cross_entropy=F.cross_entropy,
            unstack=lambda x: [x[i] for i in range(x.shape[0])])
        self._F = F
        return f"{version('burjit')} ({self.backend or default_backend()} backend)"

    def _compile(self, fn, donate=()):
        return self.bj.compile(fn, backend=self.backend, donate_argnums=donate)

    def grad(self, f, x0):
        bj, F = self.bj, self._F
        vg = bj.value_and_grad(lambda x: f(self.xp, x))
        step = self._compile(vg)
        trivial = self._compile(lambda x: (self._F.reshape(x, (-1,))[0], x))
        x, out = np.array(x0), {}

        def body(i, carry):  # x + 0 * g: each evaluation reads the last, as in the JAX adapter
            value, g = vg(carry[0])
            return carry[0] + 0.0 * g, value, g

        def run():
            out["value"], out["grad"] = step(x)
        return Bench(run, lambda: {k: np.array(v) for k, v in out.items()}, lambda: trivial(x),
                     lambda: _arena(step),
                     self._looped(lambda k: lambda x: bj.fori_loop(0, k, body, (x, F.sum(x), x)), lambda run: run(x)))

    def sgd(self, loss, params, batch, lr):
        bj = self.bj

        def train(p, b):
            value, g = bj.value_and_grad(lambda p: loss(self.xp, p, b))(p)
            return tree_map(lambda p, g: p - lr * g, p, g), value
        step = self._compile(train, donate=0)
        trivial = self._compile(lambda p, b: (p, self._F.reshape(first_leaf(p), (-1,))[0]), donate=0)
        state = {"p": tree_map(np.array, params), "loss": np.nan}

        def run():
            state["p"], state["loss"] = step(state["p"], batch)

        def poke():
            state["p"], _ = trivial(state["p"], batch)

        def k_steps(k):
            return lambda p, b: bj.fori_loop(0, k, lambda i, carry: train(carry[0], b), (p, 0.0 * first_leaf(p).sum()))

        def loop(run):
            state["p"], state["loss"] = run(state["p"], batch)
        return Bench(run, lambda: read_state(state, np.array), poke, lambda: _arena(step),
                     self._looped(k_steps, loop, donate=0))

    def _looped(self, make, call, donate=()):
        """Bench.loop: k -> call(the step of k iterations in one fori_loop). The trip count is
        fixed when a loop compiles, so each k compiles once (the worker warms each k up)."""
        steps = {}

        def loop(k):
            if k not in steps:
                steps[k] = self._compile(make(k), donate)
            call(steps[k])
        return loop


def _arena(step):
    """Arena bytes from burjit's memory plan; None for a backend that has none (reference)."""
    try:
        report = step.memory_plan()
    except AttributeError:
        return None
    return report.get("arena_bytes") if isinstance(report, dict) else getattr(report, "arena_bytes", None)


class BurjitLoad:
    """The grad step exported by a child process and `burjit.load`ed here: the worker never imports
    the compiler, so its peak RSS is what a Python program running an exported step pays."""
    family = "burjit"
    name = "burjit.load"
    dtypes = Burjit.dtypes

    def load(self, dtype):
        import burjit
        self.bj = burjit
        return f"{version('burjit')} (exported; ctypes)"

    def grad(self, f, x0):
        path = Path(tempfile.mkdtemp(prefix="burjit-load-")) / "step"
        done = subprocess.run([sys.executable, "-m", __name__, f"{f.__module__}:{f.__qualname__}", str(x0.dtype),
                               ",".join(map(str, x0.shape)), str(path)], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parents[2])
        if done.returncode:
            raise Skip(f"export failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
        step, x, out = self.bj.load(path), np.array(x0), {}

        def run():
            out["value"], out["grad"] = step(x)
        return Bench(run, lambda: {k: np.array(v) for k, v in out.items()})

    def sgd(self, loss, params, batch, lr):
        raise Skip("burjit.load rows cover the grad workloads (their function is exported by name)")


def straight_grad(target, dtype):
    """value_and_grad of the workload function `module:name`, compiled on the straight-line tier
    (the one export takes)."""
    module, name = target.split(":")
    f = getattr(importlib.import_module(module), name)
    fw = Burjit()
    fw.load(dtype)
    return fw.bj.compile(fw.bj.value_and_grad(lambda x: f(fw.xp, x)), tier="straight")


def _export(target, dtype, shape, path):
    """Export straight_grad(target, dtype) as BurjitLoad loads it."""
    import burjit
    burjit.export(straight_grad(target, dtype), np.zeros(tuple(int(n) for n in shape.split(",") if n), dtype),
                  path=path)


if __name__ == "__main__":
    _export(*sys.argv[1:])
