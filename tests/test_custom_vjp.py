"""burjit.custom_vjp: the user's backward rule replaces that of fwd's ops, on every backend."""

import numpy as np
import pytest

import burjit
from burjit import ops as F
from test_grad_fd import fd_grad


@burjit.custom_vjp
def clip_gradient(x, bound):
    """The identity whose gradient is clipped to [-bound, bound]: no op has that gradient."""
    return x


clip_gradient.defvjp(lambda x, bound: (x, bound), lambda bound, g: (F.clip(g, -bound, bound), None))

CALLS = []


@burjit.custom_vjp
def softplus(x):
    return F.log1p(F.exp(x))


def _softplus_bwd(x, g):
    CALLS.append(1)
    return (g * F.sigmoid(x),)


softplus.defvjp(lambda x: (F.log1p(F.exp(x)), x), _softplus_bwd)


def test_the_rule_replaces_the_ops_gradient(backend):
    x = np.array([0.1, 1.0, -2.0])
    g = burjit.compile(burjit.grad(lambda x: F.sum(clip_gradient(x * 3.0, 1.0) ** 2)), backend=backend)(x)
    np.testing.assert_allclose(g, 3 * np.clip(6 * x, -1, 1), rtol=1e-14)


def test_a_correct_rule_matches_finite_differences(backend):
    x = np.linspace(-3, 3, 7)
    w = np.linspace(0.5, 1.5, 7)
    CALLS.clear()
    value, g = burjit.compile(burjit.value_and_grad(lambda x: F.sum(softplus(x) * w)), backend=backend)(x)
    assert CALLS == [1]  # once per trace
    np.testing.assert_allclose(value, np.sum(np.log1p(np.exp(x)) * w), rtol=1e-12)
    np.testing.assert_allclose(g, fd_grad(lambda x: np.log1p(np.exp(x)), [x], 0, w), rtol=1e-6)
    np.testing.assert_allclose(burjit.compile(softplus, backend=backend)(x), np.log1p(np.exp(x)), rtol=1e-12)
    np.testing.assert_allclose(softplus(x), np.log1p(np.exp(x)))  # outside a trace: fun itself


@burjit.custom_vjp
def scaled_pair(p, y):
    return {"a": p["w"] * y, "b": p["w"] + y}


scaled_pair.defvjp(lambda p, y: (scaled_pair.fun(p, y), (p["w"], y)),
                   lambda res, g: ({"w": 2 * (g["a"] * res[1] + g["b"])}, g["a"] * res[0] + g["b"]))


def test_pytree_arguments_and_outputs_one_bwd_for_all_outputs():
    """The rule doubles w's cotangent (not y's), so the test sees it, not the ops, was used."""
    p, y = {"w": np.array([1.0, 2.0])}, np.array([3.0, -1.0])
    loss = lambda p, y: F.sum(scaled_pair(p, y)["a"]) + 2 * F.sum(scaled_pair(p, y)["b"])  # noqa: E731
    gp, gy = burjit.compile(burjit.grad(loss, argnums=(0, 1)))(p, y)
    np.testing.assert_allclose(gp["w"], 2 * (y + 2), rtol=1e-14)  # true: y + 2 (a call per output)
    np.testing.assert_allclose(gy, p["w"] + 2, rtol=1e-14)
    only_b = burjit.compile(burjit.grad(lambda p, y: F.sum(scaled_pair(p, y)["b"])))(p, y)
    np.testing.assert_allclose(only_b["w"], [2.0, 2.0])  # the unused output's cotangent is zero


def test_errors_name_the_users_line():
    bare = burjit.custom_vjp(lambda x: x)
    with pytest.raises(burjit.TracingError, match=r"test_custom_vjp\.py:\d+: .*\n  <lambda>: custom_vjp needs defvjp"):
        burjit.compile(bare)(np.ones(2))
    bad = burjit.custom_vjp(lambda x: x).defvjp(lambda x: (x, None), lambda r, g: g)
    with pytest.raises(burjit.TracingError, match=r"test_custom_vjp\.py:\d+: .*\n  custom_vjp: bwd must return a tuple"):
        burjit.compile(burjit.grad(lambda x: F.sum(bad(x))))(np.ones(2))
    wrong = burjit.custom_vjp(lambda x: x).defvjp(lambda x: (x, None), lambda r, g: (F.sum(g),))
    with pytest.raises(burjit.TracingError, match=r"a cotangent of shape \(\) for an argument of shape \(2,\)"):
        burjit.compile(burjit.grad(lambda x: F.sum(wrong(x))))(np.ones(2))


def _softplus_chain(x, w, n):
    for _ in range(n):
        x = np.log1p(np.exp(x * w))
    return x


def test_inside_a_loop_body_the_rule_is_replayed_by_reverse_mode(backend):
    """grad of a fori_loop/scan whose body calls the rule: the adjoint's replay of each iteration
    uses it, for body values and for captured outer values alike (w, read by fwd directly)."""
    x, w = np.array([0.1, 1.0, -2.0]), np.array([0.5, -1.0, 2.0])
    CALLS.clear()
    loop = lambda x, w: F.sum(burjit.fori_loop(0, 3, lambda i, c: softplus(c * w), x))  # noqa: E731
    gx, gw = burjit.compile(burjit.grad(loop, argnums=(0, 1)), backend=backend)(x, w)
    assert CALLS == [1]  # traced once, in the adjoint's body
    np.testing.assert_allclose(gx, fd_grad(lambda x, w: _softplus_chain(x, w, 3), [x, w], 0, 1.0), rtol=1e-6)
    np.testing.assert_allclose(gw, fd_grad(lambda x, w: _softplus_chain(x, w, 3), [x, w], 1, 1.0), rtol=1e-6)
    rows = np.arange(12.0).reshape(4, 3) - 5
    scan = lambda w: F.sum(burjit.scan(lambda c, r: (c + clip_gradient(w * r, 0.5), None), x, rows)[0])  # noqa: E731
    gs = burjit.compile(burjit.grad(scan), backend=backend)(w)
    np.testing.assert_allclose(gs, 0.5 * rows.sum(0), rtol=1e-14)  # the ops' gradient would be rows.sum(0)


def test_in_scalar_regions_of_the_tape_tier():
    """Scalar arguments recorded in a region (tier tape keeps every region compact) give the
    gradients of a hand-written reverse pass that applies the rules, on every tier."""
    def chain(a, b):
        s = a
        for _ in range(5):
            s = softplus(s * b) + clip_gradient(a, 0.25)
        return s

    a, b, ss = 0.3, 0.7, [0.3]
    for _ in range(5):
        ss.append(np.log1p(np.exp(ss[-1] * b)) + a)
    gs, ga, gb = 1.0, 0.0, 0.0
    for s in reversed(ss[:-1]):  # s_{k+1} = softplus(s_k b) + a, a's cotangent clipped
        ga += np.clip(gs, -0.25, 0.25)
        gs, gb = gs * b / (1 + np.exp(-s * b)), gb + gs * s / (1 + np.exp(-s * b))
    for tier in ("straight", "tape", "auto"):
        got = burjit.compile(burjit.grad(chain, argnums=(0, 1)), tier=tier)(a, b)
        np.testing.assert_allclose(got, (ga + gs, gb), rtol=1e-13, err_msg=tier)
