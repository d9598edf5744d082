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
        fn = jax.jit(jax.value_and_grad(lambda x: f(self.xp, x)))
        trivial = jax.jit(lambda x: (x.reshape(-1)[0], x))
        x = self.jnp.asarray(x0)

        def run():
            out["value"], out["grad"] = jax.block_until_ready(fn(x))
        return Bench(run, lambda: {k: np.asarray(v) for k, v in out.items()},
                     lambda: jax.block_until_ready(trivial(x)))

    def sgd(self, loss, params, batch, lr):
        jax = self.jax

        def train(p, b):
            value, g = jax.value_and_grad(lambda p: loss(self.xp, p, b))(p)
            return jax.tree_util.tree_map(lambda p, g: p - lr * g, p, g), value
        step = jax.jit(train, donate_argnums=0)
        trivial = jax.jit(lambda p, b: (p, first_leaf(p).reshape(-1)[0]), donate_argnums=0)
        batch = tree_map(self.jnp.asarray, batch)
        state = {"p": tree_map(self.jnp.asarray, params), "loss": np.nan}

        def run():
            state["p"], state["loss"] = jax.block_until_ready(step(state["p"], batch))

        def poke():
            state["p"], _ = jax.block_until_ready(trivial(state["p"], batch))
        return Bench(run, lambda: read_state(state, np.asarray), poke)
