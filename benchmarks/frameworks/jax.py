"""JAX: `jax.jit(jax.value_and_grad(...))`, the parameters donated to the SGD step."""

import numpy as np

from .common import Bench, first_leaf, numpy_ns, read_state, tree_map, version


class Jax:
    name = family = "jax"
    dtypes = ("float32", "float64")

    def load(self, dtype):
        import jax
        jax.config.update("jax_enable_x64", dtype == "float64")
        import jax.numpy as jnp
        self.jax, self.jnp = jax, jnp
        self.xp = numpy_ns(
            jnp, relu=jax.nn.relu, softplus=jax.nn.softplus,
            softmax=lambda x, axis=-1: jax.nn.softmax(x, axis=axis),
            cross_entropy=lambda l, t: -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(l, -1), t[:, None], -1)))
        return f"{jax.__version__} (jaxlib {version('jaxlib')})"

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
        trivial = jax.jit(lambda p, b: (p, first_leaf(p).reshape(-1)[0]), donate_argnums=0)

        def k_steps(p, b, k):
            return jax.lax.fori_loop(0, k, lambda i, carry: train(carry[0], b), (p, 0.0 * first_leaf(p).sum()))
        looped = jax.jit(k_steps, donate_argnums=0)
        batch = tree_map(self.jnp.asarray, batch)
        state = {"p": tree_map(self.jnp.asarray, params), "loss": np.nan}

        def run():
            state["p"], state["loss"] = jax.block_until_ready(step(state["p"], batch))

        def poke():
            state["p"], _ = jax.block_until_ready(trivial(state["p"], batch))

        def loop(k):
            state["p"], state["loss"] = jax.block_until_ready(looped(state["p"], batch, k))
        return Bench(run, lambda: read_state(state, np.asarray), poke, loop=loop)
