"""One adapter per framework, so that each workload's model is written once.

An adapter imports its framework pinned to one thread (`load`), offers a numpy-like namespace
`xp` that the workloads' models are written against, and turns a model into a `Bench` in the
framework's idiomatic form: `grad(f, x0)` for the value and gradient of a scalar function of a
vector, `sgd(loss, params, batch, lr)` for one training step (forward, gradients, SGD update).

The namespace `xp`: relu exp log tanh sqrt softplus, sum/mean/max(x, axis, keepdims),
softmax(x, axis), where(numpy_bool_mask, a, fill), transpose(x, axes), reshape(x, shape),
cross_entropy(logits_2d, int_targets_1d), unstack(vector) -> list of scalars; models also use
the operators + - * / ** @ and basic indexing.
"""

import importlib.metadata
import math
from types import SimpleNamespace

import numpy as np


class Skip(Exception):
    """This framework cannot run this workload (the message says why)."""


class Bench:
    """A workload built in one framework.

    step()   runs one step and returns when its results are ready (JAX dispatches asynchronously)
    read()   the check values as numpy arrays: {"value", "grad"} or {"loss", parameter paths...}
    trivial  a call, with the step's own arguments and result structure, of a compiled function
             that does no arithmetic: its time is the per-call overhead (None for eager frameworks)
    arena    () -> bytes of burjit's planned arena, or None
    loop     k -> runs k steps inside one call of the framework's own loop (jax.lax.fori_loop),
             or None for a framework without one
    """

    def __init__(self, step, read, trivial=None, arena=None, loop=None):
        self.step, self.read, self.trivial, self.arena = step, read, trivial, arena or (lambda: None)
        self.loop = loop


# -- pytrees of dicts / lists / tuples ---------------------------------------------------------

def tree_map(f, tree, *rest):
    if isinstance(tree, dict):
        return {k: tree_map(f, tree[k], *[r[k] for r in rest]) for k in tree}
    if isinstance(tree, (list, tuple)):
        return type(tree)(tree_map(f, *xs) for xs in zip(tree, *rest))
    return f(tree, *rest)


def named_leaves(tree, prefix=""):
    """{"blocks/0/attn/w": leaf, ...}: parameter paths for checks."""
    if isinstance(tree, dict):
        return {n: v for k in sorted(tree) for n, v in named_leaves(tree[k], f"{prefix}{k}/").items()}
    if isinstance(tree, (list, tuple)):
        return {n: v for i, x in enumerate(tree) for n, v in named_leaves(x, f"{prefix}{i}/").items()}
    return {prefix.rstrip("/"): tree}


def _first_leaf(tree):
    return next(iter(named_leaves(tree).values()))


def _version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _numpy_ns(np_mod, **extra):
    """The namespace for numpy-compatible modules (jax.numpy, autograd.numpy)."""
    ns = SimpleNamespace(
        exp=np_mod.exp, log=np_mod.log, tanh=np_mod.tanh, sqrt=np_mod.sqrt, where=np_mod.where,
        transpose=np_mod.transpose, reshape=np_mod.reshape,
        sum=lambda x, axis=None, keepdims=False: np_mod.sum(x, axis=axis, keepdims=keepdims),
        mean=lambda x, axis=None, keepdims=False: np_mod.mean(x, axis=axis, keepdims=keepdims),
        max=lambda x, axis=None, keepdims=False: np_mod.max(x, axis=axis, keepdims=keepdims),
        relu=lambda x: np_mod.maximum(x, 0.0),
        unstack=lambda x: [x[i] for i in range(x.shape[0])])
    vars(ns).update(extra)
    return ns


# -- burjit --------------------------------------------------------------------------------------

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
        return f"{_version('burjit')} ({self.backend or default_backend()} backend)"

    def _compile(self, fn, donate=()):
        return self.bj.compile(fn, backend=self.backend, donate_argnums=donate)

    def grad(self, f, x0):
        step = self._compile(self.bj.value_and_grad(lambda x: f(self.xp, x)))
        trivial = self._compile(lambda x: (self._F.reshape(x, (-1,))[0], x))
        x, out = np.array(x0), {}

        def run():
            out["value"], out["grad"] = step(x)
        return Bench(run, lambda: {k: np.array(v) for k, v in out.items()}, lambda: trivial(x),
                     lambda: _arena(step))

    def sgd(self, loss, params, batch, lr):
        bj = self.bj

        def train(p, b):
            value, g = bj.value_and_grad(lambda p: loss(self.xp, p, b))(p)
            return tree_map(lambda p, g: p - lr * g, p, g), value
        step = self._compile(train, donate=0)
        trivial = self._compile(lambda p, b: (p, self._F.reshape(_first_leaf(p), (-1,))[0]), donate=0)
        state = {"p": tree_map(np.array, params), "loss": np.nan}

        def run():
            state["p"], state["loss"] = step(state["p"], batch)

        def poke():
            state["p"], _ = trivial(state["p"], batch)
        return Bench(run, lambda: _read(state, np.array), poke, lambda: _arena(step))


def _arena(step):
    """Arena bytes from burjit's memory plan; None for a backend that has none (reference)."""
    try:
        report = step.memory_plan()
    except AttributeError:
        return None
    return report.get("arena_bytes") if isinstance(report, dict) else getattr(report, "arena_bytes", None)


def _read(state, to_numpy):
    return {"loss": np.array(float(state["loss"])),
            **{k: np.array(to_numpy(v)) for k, v in named_leaves(state["p"]).items()}}


# -- PyTorch, eager and torch.compile ----------------------------------------------------------------

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
            trivial = torch.compile(lambda p, b: (p, _first_leaf(p).reshape(-1)[0]))
            state = {"p": tree_map(self._t, params), "loss": np.nan}

            def run():
                state["p"], state["loss"] = step(state["p"], batch)

            def poke():
                state["p"], _ = trivial(state["p"], batch)
            return Bench(run, lambda: _read(state, _torch_numpy), poke)
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
        return Bench(run, lambda: _read(state, _torch_numpy))


def _torch_numpy(t):
    return t.detach().numpy() if hasattr(t, "detach") else t


# -- JAX -----------------------------------------------------------------------------------------

class Jax:
    name = family = "jax"
    dtypes = ("float32", "float64")

    def load(self, dtype):
        import jax
        jax.config.update("jax_enable_x64", dtype == "float64")
        import jax.numpy as jnp
        self.jax, self.jnp = jax, jnp
        self.xp = _numpy_ns(
            jnp, relu=jax.nn.relu, softplus=jax.nn.softplus,
            softmax=lambda x, axis=-1: jax.nn.softmax(x, axis=axis),
            cross_entropy=lambda l, t: -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(l, -1), t[:, None], -1)))
        return f"{jax.__version__} (jaxlib {_version('jaxlib')})"

    def grad(self, f, x0):
        jax, out = self.jax, {}
        vg = jax.value_and_grad(lambda x: f(self.xp, x))
        fn = jax.jit(vg)
        trivial = jax.jit(lambda x: (x.reshape(-1)[0], x))
        x = self.jnp.asarray(x0)

        def body(i, carry):  # x + 0 * g: each evaluation reads the last, so none is hoisted out of the loop
            value, g = vg(carry[0])
            return carry[0] + 0.0 * g, value, g
        looped = jax.jit(lambda x, k: jax.lax.fori_loop(0, k, body, (x, x.sum(), x)))

        def run():
            out["value"], out["grad"] = jax.block_until_ready(fn(x))
        return Bench(run, lambda: {k: np.asarray(v) for k, v in out.items()},
                     lambda: jax.block_until_ready(trivial(x)), loop=lambda k: jax.block_until_ready(looped(x, k)))

    def sgd(self, loss, params, batch, lr):
        jax = self.jax

        def train(p, b):
            value, g = jax.value_and_grad(lambda p: loss(self.xp, p, b))(p)
            return jax.tree_util.tree_map(lambda p, g: p - lr * g, p, g), value
        step = jax.jit(train, donate_argnums=0)
        trivial = jax.jit(lambda p, b: (p, _first_leaf(p).reshape(-1)[0]), donate_argnums=0)

        def k_steps(p, b, k):
            return jax.lax.fori_loop(0, k, lambda i, carry: train(carry[0], b), (p, 0.0 * _first_leaf(p).sum()))
        looped = jax.jit(k_steps, donate_argnums=0)
        batch = tree_map(self.jnp.asarray, batch)
        state = {"p": tree_map(self.jnp.asarray, params), "loss": np.nan}

        def run():
            state["p"], state["loss"] = jax.block_until_ready(step(state["p"], batch))

        def poke():
            state["p"], _ = jax.block_until_ready(trivial(state["p"], batch))

        def loop(k):
            state["p"], state["loss"] = jax.block_until_ready(looped(state["p"], batch, k))
        return Bench(run, lambda: _read(state, np.asarray), poke, loop=loop)


# -- autograd (HIPS) -----------------------------------------------------------------------------

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
        self.xp = _numpy_ns(
            anp, softplus=lambda x: anp.logaddexp(0.0, x), cross_entropy=cross_entropy,
            softmax=lambda x, axis=-1: anp.exp(x - logsumexp(x, axis=axis, keepdims=True)))
        return _version("autograd")

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
        return Bench(run, lambda: _read(state, np.array))


# -- micrograd: scalar Values in numpy object arrays --------------------------------------------------

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
        return _version("micrograd")

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
        return Bench(run, lambda: _read(state, lambda a: data(a).astype(np.float64)))


FRAMEWORKS = {fw.name: fw for fw in (
    Burjit(), Burjit("burjit-ref", backend="reference"), Torch(), Torch("torch.compile", compiled=True),
    Jax(), Autograd(), Micrograd())}
DEFAULT = ("burjit", "torch", "torch.compile", "jax", "autograd", "micrograd")
