"""HIPS autograd: `value_and_grad` tracing numpy on every call."""

import numpy as np

from .common import Bench, numpy_ns, read_state, tree_map, version


class Autograd:
    name = family = "autograd"
    dtypes = ("float32", "float64")

    def load(self, dtype):
        import autograd
        import autograd.numpy as anp
        from autograd.scipy.special import logsumexp
        self.ag = autograd

        def cross_entropy(logits, t):
            lp = logits - logsumexp(logits, axis=-1, keepdims=True)
            return -anp.mean(lp[np.arange(len(t)), t])
        self.xp = numpy_ns(
            anp, softplus=lambda x: anp.logaddexp(0.0, x), cross_entropy=cross_entropy,
            softmax=lambda x, axis=-1: anp.exp(x - logsumexp(x, axis=axis, keepdims=True)))
        return version("autograd")

    def grad(self, f, x0):
        fn, x, out = self.ag.value_and_grad(lambda x: f(self.xp, x)), np.array(x0), {}

        def run():
            out["value"], out["grad"] = fn(x)
        return Bench(run, lambda: {k: np.array(v) for k, v in out.items()})

    def sgd(self, loss, params, batch, lr):
        fn = self.ag.value_and_grad(lambda p: loss(self.xp, p, batch))
        state = {"p": tree_map(np.array, params), "loss": np.nan}

        def run():
            state["loss"], g = fn(state["p"])
            state["p"] = tree_map(lambda p, g: p - lr * g, state["p"], g)
        return Bench(run, lambda: read_state(state, np.array))
