"""The front door's contracts: cache keys, cache bound, donation safety, argument structures,
inspectors, copying and configuration errors (burjit/jit.py)."""

import collections
import copy
import pickle
import weakref

import numpy as np
import pytest

import burjit
from burjit import ops as F
from burjit.passes import pipeline


# -- cache keys: by type and bit pattern -------------------------------------------------------------

def test_signed_zero_python_scalars_trace_apart(backend):
    step = burjit.compile(lambda x, c: x / c, backend=backend)
    assert np.all(step(np.ones(2), 0.0) == np.inf)
    assert np.all(step(np.ones(2), -0.0) == -np.inf)


def test_static_one_one_point_oh_and_true_trace_apart(backend):
    step = burjit.compile(lambda x, c: x + (1.0 if type(c) is bool else 2.0 if type(c) is int else 3.0),
                          backend=backend, static_argnums=1)
    assert [step(np.zeros(1), c)[0] for c in (True, 1, 1.0, np.float32(1))] == [1.0, 2.0, 3.0, 3.0]
    assert len(step._cache) == 4
    assert step(np.zeros(1), (1, 2.0))[0] == 3.0 and step(np.zeros(1), (1.0, 2.0))[0] == 3.0
    assert len(step._cache) == 6  # tuples are keyed item by item


def test_static_signed_zero_and_float32_zero_trace_apart():
    step = burjit.compile(lambda x, c: x / c, static_argnums=1, backend="reference")
    assert step(np.ones(1), np.float32(-0.0))[0] == -np.inf and step(np.ones(1), np.float32(0.0))[0] == np.inf


def test_nan_argument_hits_its_cache_entry():
    step = burjit.compile(lambda x, c: x + c, backend="reference")
    static = burjit.compile(lambda x, c: x + c, backend="reference", static_argnums=1)
    for _ in range(3):
        assert np.isnan(step(np.ones(2), float("nan"))).all()
        assert np.isnan(static(np.ones(2), float("nan"))).all()
    assert len(step._cache) == 1 and len(static._cache) == 1


# -- the cache is bounded (least recently used goes first) -----------------------------------------

def test_cache_keeps_the_most_recently_used_signatures(monkeypatch):
    step = burjit.compile(lambda x: x * 2.0, backend="reference", cache_size=2)
    for n in (1, 2, 1, 3):
        step(np.ones(n))
    assert [k[0][1][0] for k in step._cache] == [(1,), (3,)]
    monkeypatch.setenv("BURJIT_CACHE_SIZE", "3")
    env = burjit.compile(lambda x: x * 2.0, backend="reference")
    for n in range(1, 6):
        env(np.ones(n))
    assert env.cache_size == 3 and len(env._cache) == 3
    assert burjit.compile(lambda x: x).cache_size == 3
    monkeypatch.delenv("BURJIT_CACHE_SIZE")
    assert burjit.compile(lambda x: x).cache_size == burjit.jit.DEFAULT_CACHE_SIZE
    with pytest.raises(ValueError, match="cache_size"):
        burjit.compile(lambda x: x, cache_size=0)


# -- donated buffers are never read through another argument -----------------------------------------

def _donate_step(backend):
    return burjit.compile(lambda w, x: (w - x, F.sum(x)), donate_argnums=0, backend=backend)


def test_donated_array_viewed_by_another_argument_is_refused(backend):
    w = np.arange(4.0)
    for view in (w[:], w.reshape(2, 2).ravel(), w.view()):
        with pytest.raises(ValueError, match="shares memory"):
            _donate_step(backend)(w, view)
        assert np.array_equal(w, np.arange(4.0))
    with pytest.raises(ValueError, match="shares memory"):
        burjit.compile(lambda w, x: (w - 1.0, F.sum(x)), donate_argnums=0, backend=backend)(w, w[1:3])


def test_overlapping_donated_slices_are_refused_and_disjoint_ones_work(backend):
    buf = np.ones(6)
    step = burjit.compile(lambda a, b: (a + 1.0, b + 2.0), donate_argnums=(0, 1), backend=backend)
    with pytest.raises(ValueError, match="shares memory"):
        step(buf[:4], buf[2:])
    assert np.array_equal(buf, np.ones(6))
    a, b = step(buf[:3], buf[3:])
    assert np.array_equal(buf, [2, 2, 2, 3, 3, 3]) and np.shares_memory(a, buf)


def test_views_of_one_buffer_are_fine_when_nothing_donated_overlaps(backend):
    buf = np.arange(8.0)
    step = burjit.compile(lambda w, x, y: (w * 2.0, F.sum(x * y)), donate_argnums=0, backend=backend)
    w = np.ones(3)
    _, s = step(w, buf[:4], buf[4:])
    assert s == np.dot(np.arange(4.0), np.arange(4.0, 8.0)) and np.array_equal(w, 2 * np.ones(3))


# -- argument structures -------------------------------------------------------------------------------

Pair = collections.namedtuple("Pair", "a b")


@pytest.mark.parametrize("make", [lambda v: collections.OrderedDict(a=v, b=v),
                                  lambda v: collections.defaultdict(int, a=v, b=v),
                                  lambda v: Pair(v, v), lambda v: [v, v], lambda v: None])
def test_container_where_an_array_was_retraces(make):
    def total(t):
        leaves = burjit.pytree.flatten(t)[0]
        return sum(F.sum(x) for x in leaves) if leaves else F.zeros_like(np.zeros(()))
    step = burjit.compile(total, backend="reference")
    assert step(np.ones(3)) == 3.0
    tree = make(np.ones(3))
    assert step(tree) == (0.0 if tree is None else 6.0)
    assert step(np.ones(2)) == 2.0


def test_dict_with_mixed_key_types(backend):
    out = burjit.compile(lambda d: {k: v * 2.0 for k, v in d.items()}, backend=backend)({1: np.ones(1), "a": np.ones(2)})
    assert set(out) == {1, "a"} and out["a"].shape == (2,) and out[1][0] == 2.0


def test_negative_static_and_donate_argnums():
    static = burjit.compile(lambda x, n: x * n, static_argnums=-1, backend="reference")
    assert static(np.ones(1), 3)[0] == 3.0 and static(np.ones(1), 4)[0] == 4.0
    assert all(k[1][0] == "static" for k in static._cache)
    w = np.ones(2)
    out = burjit.compile(lambda x, w: w + x, donate_argnums=-1, backend="reference")(np.ones(2), w)
    assert out is w and np.array_equal(w, [2.0, 2.0])
    with pytest.raises(ValueError, match="both static and donated"):
        burjit.compile(lambda x: x, static_argnums=0, donate_argnums=-1)(np.ones(1))
    with pytest.raises(TypeError, match="donate_argnums"):
        burjit.compile(lambda x: x, donate_argnums="0")


def test_donated_python_scalar_leaf_is_named():
    step = burjit.compile(lambda s: {"w": s["w"] * 2.0, "lr": s["lr"]}, donate_argnums=0, backend="reference")
    with pytest.raises(burjit.TracingError, match=r"donated argument 0 holds Python float leaves"):
        step({"w": np.ones(2), "lr": 0.1})


# -- inspection, copying, configuration ----------------------------------------------------------------

def test_hasattr_is_true_only_for_the_backends_inspectors():
    native = burjit.compile(lambda x: x * 2.0)
    ref = burjit.compile(lambda x: x * 2.0, backend="reference")
    assert hasattr(native, "llvm_ir") and hasattr(native, "memory_plan")
    assert not hasattr(native, "anything") and not hasattr(ref, "llvm_ir") and not hasattr(ref, "asm")
    with pytest.raises(AttributeError, match="reference backend has no llvm_ir"):
        ref.llvm_ir(np.ones(2))
    assert "define" in native.llvm_ir(np.ones(2))


def test_copies_and_pickles_are_working_compiled_functions(capfd):
    step = burjit.compile(lambda x, n: x * n, static_argnums=1, donate_argnums=0, cache_size=5)
    x = np.ones(2)
    step(x, 2)
    for other in (copy.copy(step), copy.deepcopy(step)):
        assert other is not step and other._cache == {} and other.cache_size == 5
        y = np.ones(2)
        assert other(y, 3) is y and np.array_equal(y, [3.0, 3.0])
    assert "Exception ignored" not in capfd.readouterr().err
    assert pickle.loads(pickle.dumps(burjit.compile(np.tanh)))(np.zeros(1))[0] == 0.0


def test_unknown_backend_lists_the_known_ones(monkeypatch):
    with pytest.raises(ValueError, match=r"unknown backend 'bogus'; known backends: mlir, native, reference"):
        burjit.compile(lambda x: x, backend="bogus")
    monkeypatch.setenv("BURJIT_BACKEND", "bogus")
    with pytest.raises(ValueError, match=r"unknown backend 'bogus' \(from \$BURJIT_BACKEND\)"):
        burjit.compile(lambda x: x * 2.0)(np.ones(1))


def test_unknown_pass_in_the_environment_is_refused(monkeypatch):
    graph = burjit.compile(lambda x: x * 2.0, backend="reference", passes=[]).graph(np.ones(2))
    monkeypatch.setenv("BURJIT_DISABLE_PASSES", "simplify,fusion")
    with pytest.raises(ValueError, match=r"BURJIT_DISABLE_PASSES.*\['fusion'\]"):
        pipeline.run(graph)


# -- the fast path: a call of the signature called last skips _signature, the native entry checks ----------

def _warm(step, *args):
    """Call twice so the entry's fast path is in place; then make _signature loud."""
    step(*args)
    step(*args)
    assert type(step).__call__ is not burjit.jit.CompiledFunction.__call__


def test_the_signature_called_last_skips_the_python_checks(monkeypatch):
    step = burjit.compile(lambda p, s: {"w": p["w"] * s, "n": F.sum(p["b"])})
    p, s = {"w": np.ones((2, 3)), "b": np.arange(3.0)}, np.float64(2.5)
    _warm(step, p, s)
    calls = []
    real = burjit.jit.CompiledFunction._signature
    monkeypatch.setattr(burjit.jit.CompiledFunction, "_signature", lambda self, a: calls.append(1) or real(self, a))
    out = step(p, s)  # a numpy scalar, read in place by the entry
    assert not calls and np.array_equal(out["w"], np.full((2, 3), 2.5)) and out["n"] == 3.0
    out = step(p, np.array(4.0))  # a 0-d array takes the same path
    assert not calls and np.array_equal(out["w"], np.full((2, 3), 4.0))
    out = step({"w": np.ones((3, 3)), "b": np.arange(3.0)}, s)  # another shape: the slow path, a new entry
    assert calls and out["w"].shape == (3, 3)


@pytest.mark.parametrize("case", ["shape", "dtype", "scalar dtype", "non-contiguous", "list", "subclass",
                                  "python float", "missing key", "extra key"])
def test_a_changed_argument_after_the_fast_path_gives_what_a_fresh_step_gives(case):
    def f(p, s):
        return p["w"] * s + F.sum(p["b"])
    good = ({"w": np.ones((2, 3)), "b": np.arange(3.0)}, np.float64(2.0))
    w = np.arange(12.0).reshape(3, 4)[:, :3]
    p, s = {
        "shape": ({"w": np.ones((2, 2)), "b": np.arange(3.0)}, good[1]),
        "dtype": ({"w": np.ones((2, 3), np.float32), "b": np.arange(3.0)}, good[1]),
        "scalar dtype": (good[0], np.float32(2.0)),
        "non-contiguous": ({"w": w[:2], "b": np.arange(3.0)}, good[1]),
        "list": ({"w": [[1.0] * 3] * 2, "b": np.arange(3.0)}, good[1]),
        "subclass": ({"w": np.ones((2, 3)).view(type("Sub", (np.ndarray,), {})), "b": np.arange(3.0)}, good[1]),
        "python float": (good[0], 3.0),
        "missing key": ({"w": np.ones((2, 3))}, good[1]),
        "extra key": ({"w": np.ones((2, 3)), "b": np.arange(3.0), "c": np.ones(1)}, good[1]),
    }[case]
    step = burjit.compile(f)
    _warm(step, *good)
    try:
        expected = burjit.compile(f)(p, s)
    except Exception as e:  # noqa: BLE001 (the fresh step's error is the expectation)
        with pytest.raises(type(e), match=str(e)[:40].replace("(", r"\(").replace(")", r"\)")):
            step(p, s)
    else:
        np.testing.assert_array_equal(step(p, s), expected)
    np.testing.assert_array_equal(step(*good), burjit.compile(f)(*good))


def test_donation_checks_hold_on_the_fast_path():
    step = burjit.compile(lambda w, x: (w - x, F.sum(x)), donate_argnums=0)
    w, x = np.arange(4.0), np.ones(4)
    _warm(step, w, x)
    for view in (w, w[:], w.reshape(2, 2).ravel()):
        with pytest.raises(ValueError, match="shares memory"):
            step(w, view)
    frozen = np.arange(4.0)
    frozen.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        step(frozen, x)
    before = w.copy()
    new, total = step(w, x)
    assert new is w and np.array_equal(w, before - 1.0) and total == 4.0
    with pytest.raises(ValueError, match="non-contiguous"):
        step(np.arange(8.0)[::2], x)


def test_a_traced_value_on_the_fast_path_is_refused():
    inner = burjit.compile(lambda x: x * 2.0)
    _warm(inner, np.ones(2))
    with pytest.raises(burjit.TracingError, match="traced values"):
        burjit.compile(lambda x: inner(x))(np.ones(2))


def test_a_donated_argument_returned_whole_comes_back_as_the_callers_container():
    """On the fast path a result that is a donated argument, leaf for leaf, is the caller's own
    container (its arrays were updated in place); any other result is built fresh."""
    step = burjit.compile(lambda p, x: ({k: p[k] * x for k in p}, [p["a"] + 1.0], F.sum(x)), donate_argnums=0)
    p, x = {"a": np.ones(3), "b": np.arange(3.0)}, np.full(3, 2.0)
    _warm(step, {"a": np.ones(3), "b": np.arange(3.0)}, x)
    for k in range(1, 4):
        q, others, total = step(p, x)
        assert q is p and total == 6.0
        np.testing.assert_array_equal(p["a"], np.full(3, 2.0 ** k))
        np.testing.assert_array_equal(p["b"], np.arange(3.0) * 2.0 ** k)
        np.testing.assert_array_equal(others[0], np.full(3, 2.0 ** (k - 1) + 1.0))
    swapped = burjit.compile(lambda p: {"a": p["b"] * 1.0, "b": p["a"] * 1.0}, donate_argnums=0)
    p = {"a": np.ones(2), "b": np.zeros(2)}
    _warm(swapped, {"a": np.ones(2), "b": np.zeros(2)})
    out = swapped(p)
    assert out is not p and np.array_equal(out["a"], np.zeros(2)) and np.array_equal(out["b"], np.ones(2))


def test_overlap_checks_hold_when_the_donated_inputs_stay_and_others_move():
    """The entry re-checks only inputs that moved since the last good call: a view of a donated
    array passed where another array was is still refused, and so is a donated array moved
    onto another argument's memory."""
    step = burjit.compile(lambda w, x, y: (w + x + y, F.sum(x)), donate_argnums=0)
    w, x, y = np.zeros(4), np.ones(4), np.ones(4)
    _warm(step, w, x, y)
    step(w, x, y)
    for bad in ((w, x, w[:]), (w, w.reshape(2, 2).ravel(), y)):
        with pytest.raises(ValueError, match="shares memory"):
            step(*bad)
    big = np.zeros(8)
    with pytest.raises(ValueError, match="shares memory"):
        step(big[:4], big[2:6], y)
    out, _ = step(w, np.ones(4), y)
    assert out is w and np.array_equal(w, np.full(4, 8.0))  # four good calls of w + 1 + 1; the refused ones wrote nothing


def test_each_compiled_function_keeps_its_own_fast_path():
    # the fast path is the __call__ of the function's own class: installing one must not touch another
    double, square = burjit.compile(lambda x: x * 2.0), burjit.compile(lambda x: x * x)
    x = np.arange(3.0)
    _warm(double, x)
    _warm(square, x)
    assert type(double) is not type(square) and isinstance(double, burjit.jit.CompiledFunction)
    for _ in range(2):
        np.testing.assert_array_equal(double(x), 2.0 * x)
        np.testing.assert_array_equal(square(x), x * x)
        np.testing.assert_array_equal(double(np.arange(4.0)), 2.0 * np.arange(4.0))  # another signature
    assert type(double).__name__ == "CompiledFunction" and type(copy.copy(double)) is not type(double)


def test_the_fast_path_takes_the_functions_own_parameters(monkeypatch):
    """Keyword calls bind on the fast path (no _signature), a default given or left out is a
    signature of its own, Python's argument errors name the function, a parameter named like the
    fast path's own locals still works, and nothing holds the compiled function in a cycle."""
    def step(p, g, lr=0.25):
        return p - lr * g

    compiled, a, b = burjit.compile(step), np.ones(3), np.full(3, 2.0)
    _warm(compiled, a, b)
    calls = []
    real = burjit.jit.CompiledFunction._signature
    monkeypatch.setattr(burjit.jit.CompiledFunction, "_signature", lambda self, x: calls.append(1) or real(self, x))
    assert np.array_equal(compiled(g=b, p=a), [0.5] * 3) and not calls
    assert np.array_equal(compiled(a, b, lr=np.array(1.0)), [-1.0] * 3) and calls  # another signature
    assert np.array_equal(compiled(a, b), [0.5] * 3)  # back: lr left out
    for call, message in ((lambda: compiled(a, b, 1.0, 2), r"step\(\) takes from 2 to 3 positional arguments"),
                          (lambda: compiled(a, z=b), r"step\(\) got an unexpected keyword argument 'z'")):
        with pytest.raises(TypeError, match=message):
            call()
    reserved = burjit.compile(lambda i, o: i - o)  # i and o name the fast path's locals: it takes (*a, **k)
    _warm(reserved, a, b)
    assert np.array_equal(reserved(o=b, i=a), [-1.0] * 3)
    ref = weakref.ref(compiled)
    del compiled
    assert ref() is None  # freed at once (its native code with it), not left to the cycle collector
