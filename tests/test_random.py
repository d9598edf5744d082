"""burjit.random: Threefry-2x32 against Random123's known-answer vectors, the same numbers on
every backend and tier, sane distributions, keys as step state; nn.dropout."""

import numpy as np
import pytest

import burjit
from burjit import nn, random
from burjit import ops as F

# Random123's kat_vectors, threefry2x32 with 20 rounds: counter words, key words, result words.
KAT = [("00000000 00000000", "00000000 00000000", "6b200159 99ba4efe"),
       ("ffffffff ffffffff", "ffffffff ffffffff", "1cb996fc bb002be7"),
       ("243f6a88 85a308d3", "13198a2e 03707344", "c4923a9c 483df7a0")]


def _words(text):
    return np.array([int(t, 16) for t in text.split()], np.uint32).view(np.int32)


def test_threefry_known_answers(backend):
    f = burjit.compile(lambda k, c: random.threefry2x32(k, c[0:1], c[1:2]), backend=backend)
    for ctr, k, want in KAT:
        assert np.array_equal(np.concatenate(f(_words(k), _words(ctr))), _words(want))


def _draws(k):
    k1, k2, k3 = random.split(k, 3)
    return (random.uniform(k1, (1000,)), random.uniform(k2, (4, 5), "float64", -2.0, 3.0),
            random.normal(k3, (1000,), "float64"), random.bernoulli(k1, 0.3, (7,)), random.split(k, 2),
            random.bits(k, 5))


@pytest.mark.parametrize("tier", ["straight", "tape"])
def test_same_numbers_on_every_backend_and_tier(backend, tier):
    k = random.key(42)
    want = burjit.compile(_draws, backend="reference")(k)
    got = burjit.compile(_draws, backend=backend, tier=tier)(k)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if g.dtype == np.float64 and g.shape == (1000,):  # normal: through log and cos, within rounding
            np.testing.assert_allclose(g, w, rtol=1e-13, atol=1e-13)
        else:
            assert np.array_equal(g, w)


def test_distributions_look_right():
    u, u64, z, _, keys, _ = burjit.compile(_draws)(random.key(7))
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.03 and u.dtype == np.float32
    assert -2 <= u64.min() and u64.max() < 3
    assert abs(z.mean()) < 0.1 and abs(z.std() - 1) < 0.1
    b = burjit.compile(lambda k: random.bernoulli(k, 0.3, (20000,)))(random.key(1))
    assert abs(b.mean() - 0.3) < 0.02 and b.dtype == np.bool_
    assert not np.array_equal(keys[0], keys[1])
    one = burjit.compile(lambda k: random.uniform(k, (8,)))
    assert not np.array_equal(one(random.key(1)), one(random.key(2)))


def test_keys_are_step_state():
    @burjit.compile(donate_argnums=0)
    def step(k):
        k, sub = random.split(k)
        return k, random.uniform(sub, (3,))

    k, seen = random.key(0), []
    for _ in range(3):
        k, u = step(k)
        seen.append(u)
    assert len({tuple(u) for u in seen}) == 3 and len(step._cache) == 1
    assert random.key(2 ** 32 + 5).tolist() == [1, 5]
    with pytest.raises(ValueError, match="seed must lie in"):
        random.key(-1)


def test_dropout(backend):
    x = np.linspace(1, 2, 10000)
    drop = burjit.compile(lambda k, x: nn.dropout(k, x, 0.25), backend=backend)
    y = drop(random.key(3), x)
    kept = y != 0
    assert abs(kept.mean() - 0.75) < 0.02
    np.testing.assert_allclose(y[kept], x[kept] / 0.75, rtol=1e-15)
    g = burjit.compile(burjit.grad(lambda x, k: F.sum(nn.dropout(k, x, 0.25))), backend=backend)(x, random.key(3))
    np.testing.assert_allclose(g, kept / 0.75, rtol=1e-15)  # the same mask: the same key
    np.testing.assert_array_equal(burjit.compile(lambda k, x: nn.dropout(k, x, 0.5, train=False))(random.key(3), x), x)
    with pytest.raises(ValueError, match=r"test_random\.py:\d+: .*\n  dropout: rate must lie in"):
        burjit.compile(lambda k, x: nn.dropout(k, x, 1.0))(random.key(3), x)


def test_a_wrong_key_names_the_users_line():
    with pytest.raises(burjit.TracingError, match=r"test_random\.py:\d+: .*\n  random: a key is an int32 array "
                                                  r"of shape \(2,\) .*, got float64\[3\]"):
        burjit.compile(lambda k: random.uniform(k, (3,)))(np.ones(3))
    with pytest.raises(burjit.TracingError, match=r"got int32\[2, 2\]"):
        burjit.compile(lambda k: nn.dropout(random.split(k), np.ones(3), 0.5, True))(random.key(1))
