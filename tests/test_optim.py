"""Optimizers against a numpy reimplementation of their update rules, over several steps.

The compiled step takes the gradients as inputs, so the update rule is all that is tested;
it donates params and state, so the test also sees that both are updated in place and
that the traced step counter keeps one compiled program for every step.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import burjit
from burjit import optim
from burjit.pytree import flatten


def np_sgd(lr, momentum=0.0):
    def step(p, g, slot, t):
        if not momentum:
            return p - lr * g, slot
        v = momentum * slot.get("v", 0.0) + g
        return p - lr * v, {"v": v}
    return step


def np_adamw(lr, b1, b2, eps, weight_decay):
    def step(p, g, slot, t):
        m = b1 * slot.get("m", 0.0) + (1 - b1) * g
        v = b2 * slot.get("v", 0.0) + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        return p - lr * (m_hat / (np.sqrt(v_hat) + eps) + weight_decay * p), {"m": m, "v": v}
    return step


RULES = {
    "sgd": (optim.sgd(0.1), np_sgd(0.1)),
    "momentum": (optim.sgd(0.05, momentum=0.9), np_sgd(0.05, 0.9)),
    "adam": (optim.adam(0.01, 0.8, 0.95, 1e-6), np_adamw(0.01, 0.8, 0.95, 1e-6, 0.0)),
    "adamw": (optim.adamw(0.02, 0.9, 0.999, 1e-8, 0.1), np_adamw(0.02, 0.9, 0.999, 1e-8, 0.1)),
}
STEPS = {}  # (rule, backend) -> compiled step, shared by hypothesis examples


def _step(rule, backend):
    if (rule, backend) not in STEPS:
        opt = RULES[rule][0]
        STEPS[rule, backend] = burjit.compile(lambda p, s, g: opt.update(p, g, s), backend=backend,
                                              donate_argnums=(0, 1))
    return STEPS[rule, backend]


def _params(rng):
    return {"w": rng.standard_normal((3, 2)).astype(np.float32), "b": [rng.standard_normal(4)]}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_update_matches_numpy(rule, backend):
    opt, np_step = RULES[rule]
    step = _step(rule, backend)

    @given(seed=st.integers(0, 2 ** 32 - 1))
    def check(seed):
        rng = np.random.default_rng(seed)
        params = _params(rng)
        state = opt.init(params)
        want = [leaf.copy() for leaf in flatten(params)[0]]
        slots = [{} for _ in want]
        for t in range(1, 5):
            grads = _params(rng)
            ids = [id(a) for a in flatten((params, state))[0]]
            params, state = step(params, state, grads)
            assert [id(a) for a in flatten((params, state))[0]] == ids  # written in place
            for i, g in enumerate(flatten(grads)[0]):
                want[i], slots[i] = np_step(want[i], g, slots[i], t)
            for got, w in zip(flatten(params)[0], want):
                assert got.dtype == w.dtype
                tol = (2e-5, 1e-6) if got.dtype == np.float32 else (1e-12, 1e-14)  # float32: rounding
                np.testing.assert_allclose(got, w, rtol=tol[0], atol=tol[1])
        if "step" in state:
            assert state["step"] == 4
    check()
    assert len(step._cache) == 1  # the step counter is traced: no retrace per step


@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clip_by_global_norm(max_norm):
    rng = np.random.default_rng(0)
    grads = _params(rng)
    clipped = burjit.compile(lambda g: optim.clip_by_global_norm(g, max_norm), backend="reference")(grads)
    leaves = flatten(grads)[0]
    norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in leaves))
    scale = min(1.0, max_norm / (norm + 1e-6))
    for got, g in zip(flatten(clipped)[0], leaves):
        assert got.dtype == g.dtype
        np.testing.assert_allclose(got, g * scale, rtol=1e-6)


def test_traced_learning_rate_keeps_parameter_dtypes(backend):
    """A schedule feeds lr as a float64 0-d input; float32 parameters must stay float32 (and in place)."""
    step = burjit.compile(lambda p, s, g, lr: optim.adamw(lr, weight_decay=0.1).update(p, g, s),
                          backend=backend, donate_argnums=(0, 1))
    rng = np.random.default_rng(0)
    params = _params(rng)
    state = optim.adamw().init(params)
    want, slots = [a.copy() for a in flatten(params)[0]], [{} for _ in range(2)]
    for t, lr in enumerate([0.1, 0.05, 0.02], 1):
        grads = _params(rng)
        params, state = step(params, state, grads, np.array(lr))
        for i, g in enumerate(flatten(grads)[0]):
            want[i], slots[i] = np_adamw(lr, 0.9, 0.999, 1e-8, 0.1)(want[i], g, slots[i], t)
    for got, w in zip(flatten(params)[0], want):
        assert got.dtype == w.dtype
        np.testing.assert_allclose(got, w, rtol=2e-5, atol=1e-6)
    assert len(step._cache) == 1
