"""Counter-based random numbers inside a compiled step: Threefry-2x32 (Salmon et al., SC'11),
20 rounds, as JAX uses it.

A key is an int32 array of shape (2,) holding two 32-bit words, an ordinary value: pass it
into the step and return the next one, like any other state, so the step stays pure and its
numbers are the same on every backend and tier (the generator is a function of key and
counter, written in traced ops: int32 add, xor and shifts wrap exactly as uint32 words do).

    key = random.key(0)
    key, sub = random.split(key)
    x = random.normal(sub, (3, 4))
"""

import math

import numpy as np

from . import ops as F
from .errors import TracingError
from .tracer import bind, describe, lift, user_src

__all__ = ["key", "split", "bits", "uniform", "normal", "bernoulli", "threefry2x32"]

_ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)
_PARITY = 0x1BD11BDA  # Threefry's key-schedule constant


def key(seed):
    """A key from an integer seed in [0, 2^64): its high and low 32-bit words (jax.random.PRNGKey)."""
    seed = int(seed)
    if not 0 <= seed < 1 << 64:
        raise ValueError(f"random.key: a seed must lie in [0, 2^64), got {seed}")
    return np.array([seed >> 32, seed & 0xFFFFFFFF], np.uint32).view(np.int32)


def _rotl(x, r):
    """x's 32 bits rotated left by r: the two shifted halves share no bit, so their sum is their or."""
    return bind("shl", [x], bits=r) + bind("lshr", [x], bits=32 - r)


def threefry2x32(k, x0, x1):
    """Threefry-2x32 of the counter words (x0, x1) (int32 arrays of one shape) under key k."""
    k = lift(k)
    if (k.shape, k.dtype) != ((2,), "int32"):  # every generator comes here: one check names the misuse
        raise TracingError(f"{describe(user_src())}\n  random: a key is an int32 array of shape (2,) (from "
                           f"random.key(seed) or random.split), got {k.dtype}{list(k.shape)}")
    x0, x1 = lift(x0), lift(x1)
    k0, k1 = F.broadcast_to(k[0], x0.shape), F.broadcast_to(k[1], x0.shape)
    ks = [k0, k1, F._elementwise("xor", F._elementwise("xor", k0, k1), _PARITY)]
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for i in range(20):
        x0 = x0 + x1
        x1 = F._elementwise("xor", _rotl(x1, _ROTATIONS[i % 8]), x0)
        if i % 4 == 3:
            s = (i + 1) // 4
            x0, x1 = x0 + ks[s % 3], x1 + ks[(s + 1) % 3] + s
    return x0, x1


def bits(k, n):
    """n random int32 words: Threefry of the counters (0, 0), (1, 0), ..., both words each."""
    m = (n + 1) // 2
    i = bind("iota", [], shape=(m,), axis=0, dtype="int32")
    y0, y1 = threefry2x32(k, i, F.zeros_like(i))
    return F.concatenate([y0, y1])[:n] if n else F.zeros_like(i, shape=(0,))


def split(k, num=2):
    """num new keys (num, 2) from k; use each once, keep none of them and k both."""
    return F.reshape(bits(k, 2 * num), (num, 2))


def _shape(shape):
    return (shape,) if isinstance(shape, int) else tuple(shape)


def uniform(k, shape=(), dtype="float32", minval=0.0, maxval=1.0):
    """Uniform in [minval, maxval): float32 from 23 random bits, float64 from 53 (two words)."""
    shape = _shape(shape)
    n = math.prod(shape)
    if np.dtype(dtype) == np.float32:
        u = F.astype(bind("lshr", [bits(k, n)], bits=9), "float32") * np.float32(2.0 ** -23)
    else:
        w = bits(k, 2 * n)
        hi, lo = bind("lshr", [w[:n]], bits=5), bind("lshr", [w[n:]], bits=6)
        u = (F.astype(hi, "float64") * 2.0 ** 26 + F.astype(lo, "float64")) * 2.0 ** -53
        u = F.astype(u, dtype)
    u = F.reshape(u, shape)
    return u if (minval, maxval) == (0.0, 1.0) else u * (maxval - minval) + minval


def normal(k, shape=(), dtype="float32"):
    """Standard normal by Box-Muller over two uniforms per number (1 - u keeps log's argument > 0)."""
    shape = _shape(shape)
    u = uniform(k, (2,) + shape, "float64")
    z = F.sqrt(-2.0 * F.log(1.0 - u[0])) * F.cos(2.0 * math.pi * u[1])
    return F.astype(z, dtype)


def bernoulli(k, p=0.5, shape=()):
    """True with probability p (a float or an array broadcasting to shape)."""
    return uniform(k, shape, "float64") < p

