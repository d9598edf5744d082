"""burjit itself: `burjit.compile` of `value_and_grad`, the parameters donated to the SGD step."""

from types import SimpleNamespace

import numpy as np

from .common import Bench, first_leaf, read_state, tree_map, version


class Burjit:
    family = "burjit"
    dtypes = ("float32", "float64")

    def __init__(self, name="burjit", backend=None):
        self.name, self.backend = name, backend

    def load(self, dtype):
        import burjit
        from burjit import ops as F
        from burjit.jit import default_backend
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
