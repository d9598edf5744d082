"""Optimizers against a numpy reimplementation of their update rules, over several steps.

The compiled step takes the gradients as inputs, so the update rule is all that is tested;
it donates params and state, so the test also sees that both are updated in place and
that the traced step counter keeps one compiled program for every step.
"""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import burjit
from burjit import optim
from burjit import ops as F
from burjit.pytree import flatten, leaf_paths, tree_map


def _rate(lr, t):
    """lr, or a numpy schedule's value after t - 1 updates."""
    return lr(t - 1) if callable(lr) else lr


def np_sgd(lr, momentum=0.0):
    def step(p, g, slot, t):
        if not momentum:
            return p - _rate(lr, t) * g, slot
        v = momentum * slot.get("v", 0.0) + g
        return p - _rate(lr, t) * v, {"v": v}
    return step


def np_adamw(lr, b1, b2, eps, weight_decay):
    """Decay on leaves of 2+ dimensions only: optim's default mask."""
    def step(p, g, slot, t):
        m = b1 * slot.get("m", 0.0) + (1 - b1) * g
        v = b2 * slot.get("v", 0.0) + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        wd = weight_decay if p.ndim >= 2 else 0.0
        return p - _rate(lr, t) * (m_hat / (np.sqrt(v_hat) + eps) + wd * p), {"m": m, "v": v}
    return step


def np_rmsprop(lr, alpha, eps, momentum=0.0):
    def step(p, g, slot, t):
        v = alpha * slot.get("v", 0.0) + (1 - alpha) * g * g
        s = g / (np.sqrt(v) + eps)
        if momentum:
            s = momentum * slot.get("b", 0.0) + s
        return p - _rate(lr, t) * s, {"v": v, "b": s}
    return step


def np_lion(lr, b1, b2, weight_decay):
    def step(p, g, slot, t):
        m = slot.get("m", 0.0)
        wd = weight_decay if p.ndim >= 2 else 0.0
        return p - _rate(lr, t) * (np.sign(b1 * m + (1 - b1) * g) + wd * p), {"m": b2 * m + (1 - b2) * g}
    return step


def np_cosine(peak, warmup, steps):
    """warmup_cosine(peak, warmup, steps) by hand."""
    def lr(count):
        if count < warmup:
            return peak * count / warmup
        return peak * 0.5 * (1 + math.cos(math.pi * min((count - warmup) / (steps - warmup), 1.0)))
    return lr


RULES = {
    "sgd": (optim.sgd(0.1), np_sgd(0.1)),
    "momentum": (optim.sgd(0.05, momentum=0.9), np_sgd(0.05, 0.9)),
    "adam": (optim.adam(0.01, 0.8, 0.95, 1e-6), np_adamw(0.01, 0.8, 0.95, 1e-6, 0.0)),
    "adamw": (optim.adamw(0.02, 0.9, 0.999, 1e-8, 0.1), np_adamw(0.02, 0.9, 0.999, 1e-8, 0.1)),
    "rmsprop": (optim.rmsprop(0.01, 0.9, 1e-6), np_rmsprop(0.01, 0.9, 1e-6)),
    "rmsprop_momentum": (optim.rmsprop(0.01, 0.99, 1e-8, momentum=0.5), np_rmsprop(0.01, 0.99, 1e-8, 0.5)),
    "lion": (optim.lion(0.003, 0.9, 0.99, weight_decay=0.5), np_lion(0.003, 0.9, 0.99, 0.5)),
    "sgd_cosine": (optim.sgd(optim.warmup_cosine(0.1, 2, 3)), np_sgd(np_cosine(0.1, 2, 3))),
    "adamw_cosine": (optim.adamw(optim.warmup_cosine(0.02, 1, 4), weight_decay=0.1),
                     np_adamw(np_cosine(0.02, 1, 4), 0.9, 0.999, 1e-8, 0.1)),
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


SCHEDULES = {  # schedule -> its values after 0, 1, 2, ... updates, by hand
    "linear": (optim.linear(0.0, 1.0, 4), [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]),
    "cosine": (optim.cosine_decay(1.0, 4), [1.0, 0.8535533905932737, 0.5, 0.14644660940672627, 0.0, 0.0]),
    "cosine_to_end": (optim.cosine_decay(1.0, 2, end=0.5), [1.0, 0.75, 0.5, 0.5]),
    "step": (optim.step_decay(1.0, 2, 0.5), [1.0, 1.0, 0.5, 0.5, 0.25, 0.25, 0.125]),
    "warmup_cosine": (optim.warmup_cosine(1.0, 2, 6), [0.0, 0.5, 1.0, 0.8535533905932737, 0.5,
                                                      0.14644660940672627, 0.0, 0.0]),
    "constant": (optim.constant(0.3), [0.3, 0.3]),
    "join": (optim.join([optim.constant(2.0), optim.linear(1.0, 0.0, 2)], [3]), [2.0, 2.0, 2.0, 1.0, 0.5, 0.0, 0.0]),
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_schedule_values(name, backend):
    schedule, want = SCHEDULES[name]
    value = burjit.compile(lambda count: F.astype(schedule(count), "float64") + 0.0, backend=backend)
    got = [float(value(np.array(k, np.int64))) for k in range(len(want))]
    np.testing.assert_allclose(got, want, rtol=1e-15, atol=1e-15)


def test_join_needs_one_boundary_fewer_than_schedules():
    with pytest.raises(ValueError, match="2 schedules need 1 boundaries, got 2"):
        optim.join([optim.constant(1.0), optim.constant(2.0)], [1, 2])


def _run(opt, params, grads_seq, backend="reference"):
    step = burjit.compile(lambda p, s, g: opt.update(p, g, s), backend=backend)
    state = opt.init(params)
    for grads in grads_seq:
        params, state = step(params, state, grads)
    return params, state


def _model(rng):
    """A weight, a bias and a LayerNorm gain, as a model's parameters are."""
    return {"w": rng.standard_normal((3, 2)), "b": rng.standard_normal(2), "ln": {"g": np.ones(2)}}


@pytest.mark.parametrize("make", [lambda mask: optim.adamw(0.1, weight_decay=0.5, mask=mask),
                                  lambda mask: optim.lion(0.1, weight_decay=0.5, mask=mask)],
                         ids=["adamw", "lion"])
def test_weight_decay_mask(make):
    """Zero gradients: only decay moves a parameter, so what moved is exactly what the mask decays."""
    params = _model(np.random.default_rng(0))
    zeros = [tree_map(np.zeros_like, params)] * 3

    def moved(mask):
        new, _ = _run(make(mask), params, zeros)
        return {path: not np.array_equal(a, b) for path, a, b in
                zip(leaf_paths(flatten(params)[1]), flatten(new)[0], flatten(params)[0])}
    default = moved(None)
    assert [p for p, m in default.items() if m] == [("w",)]  # ndim >= 2 only
    everything = moved(lambda path, leaf: True)
    assert all(everything.values())
    tree = moved({"w": False, "b": True, "ln": {"g": False}})
    assert [p for p, m in tree.items() if m] == [("b",)]
    with pytest.raises(ValueError, match="structure of params"):
        moved({"w": True, "b": True})


def test_accumulate_applies_the_mean_every_k_steps():
    """accumulate(adam, 3) over 6 micro-batches == adam over 2 steps of their means, and the
    parameters stand still in between."""
    rng = np.random.default_rng(1)
    params = _model(rng)
    micro = [_model(rng) for _ in range(6)]
    opt = optim.accumulate(optim.adam(0.1), 3)
    step = burjit.compile(lambda p, s, g: opt.update(p, g, s))
    state, got, seen = opt.init(params), params, []
    for grads in micro:
        got, state = step(got, state, grads)
        seen.append(flatten(got)[0])
    means = [tree_map(lambda *g: sum(g) / 3, *micro[i:i + 3]) for i in (0, 3)]
    want, _ = _run(optim.adam(0.1), params, means)
    for a, b in zip(flatten(got)[0], flatten(want)[0]):
        np.testing.assert_allclose(a, b, rtol=1e-13)
    for i in (0, 1, 3, 4):  # between updates: as after the last update
        before = flatten(params)[0] if i < 2 else seen[2]
        assert all(np.array_equal(a, b) for a, b in zip(seen[i], before))
    assert state["micro"] == 0 and all(not s.any() for s in flatten(state["sum"])[0])


def test_accumulate_refuses_a_bad_k():
    with pytest.raises(ValueError, match="positive int"):
        optim.accumulate(optim.sgd(0.1), 0)


def test_schedules_refuse_bad_lengths():
    for make, what in ((lambda: optim.linear(0.0, 1.0, 0), "linear: steps"),
                       (lambda: optim.cosine_decay(0.1, -5), "cosine_decay: steps"),
                       (lambda: optim.step_decay(0.1, 2.5, 0.5), "step_decay: every"),
                       (lambda: optim.warmup_cosine(0.1, -1, 10), "warmup_cosine: warmup")):
        with pytest.raises(ValueError, match=what + " must be an int >= "):
            make()
    with pytest.raises(ValueError, match=r"warmup \(10\) must be shorter than steps \(10\)"):
        optim.warmup_cosine(0.1, 10, 10)
    with pytest.raises(ValueError, match=r"boundaries must not decrease, got \[5, 3\]"):
        optim.join([optim.constant(1.0)] * 3, [5, 3])
    no_warmup = burjit.compile(optim.warmup_cosine(0.1, 0, 10))
    assert np.allclose([no_warmup(np.int64(c)) for c in (0, 5, 10)], [0.1, 0.05, 0.0])


def test_chain_clips_before_the_optimizer():
    rng = np.random.default_rng(2)
    params, grads = _model(rng), [_model(rng)]
    got, _ = _run(optim.chain(optim.clip(0.5), optim.sgd(0.1)), params, grads)
    clip = burjit.compile(lambda g: optim.clip_by_global_norm(g, 0.5), backend="reference")
    want, _ = _run(optim.sgd(0.1), params, [clip(grads[0])])
    for a, b in zip(flatten(got)[0], flatten(want)[0]):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="one Optimizer last"):
        optim.chain(optim.sgd(0.1), optim.clip(1.0))


def _torch_run(torch_opt, params, grads_seq):
    """params after torch_opt(list of tensors) steps through grads_seq (float64)."""
    torch = pytest.importorskip("torch")
    names = leaf_paths(flatten(params)[1])
    tensors = {n: torch.tensor(a, requires_grad=True) for n, a in zip(names, flatten(params)[0])}
    opt = torch_opt(tensors)
    for grads in grads_seq:
        for n, g in zip(names, flatten(grads)[0]):
            tensors[n].grad = torch.tensor(g)
        opt.step()
    return [tensors[n].detach().numpy() for n in names]


def test_adamw_default_mask_matches_torch_param_groups():
    """torch's AdamW with biases and gains in a group without decay: the recipe the default follows."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    params, grads = _model(rng), [_model(rng) for _ in range(4)]
    got, _ = _run(optim.adamw(0.05, weight_decay=0.3), params, grads)
    want = _torch_run(lambda t: torch.optim.AdamW(
        [{"params": [v for v in t.values() if v.ndim >= 2], "weight_decay": 0.3},
         {"params": [v for v in t.values() if v.ndim < 2], "weight_decay": 0.0}], lr=0.05), params, grads)
    for a, b in zip(flatten(got)[0], want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("momentum", [0.0, 0.7])
def test_rmsprop_matches_torch(momentum):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    params, grads = _model(rng), [_model(rng) for _ in range(4)]
    got, _ = _run(optim.rmsprop(0.01, 0.9, 1e-8, momentum), params, grads)
    want = _torch_run(lambda t: torch.optim.RMSprop(list(t.values()), lr=0.01, alpha=0.9, eps=1e-8,
                                                    momentum=momentum), params, grads)
    for a, b in zip(flatten(got)[0], want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
