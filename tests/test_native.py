"""The native executable at run time: object cache, index errors that change nothing, poisoned arena,
donated buffers (including swaps), inspection and dumps, and training that matches the reference."""

import os
import sys
import threading

import llvmlite.binding as llvm
import numpy as np
import pytest

import burjit
from burjit import ops as F
from burjit.codegen import NativeExecutable, build, cache, engine, lowering, objects
from burjit.codegen.program import Program
from burjit.passes import pipeline


def _graph(fn, *args, donate=()):
    return burjit.compile(fn, backend="reference", donate_argnums=donate).graph(*args)


# -- cache ------------------------------------------------------------------------------------

def test_cache_round_trip_and_corrupt_entries_recompile(tmp_path, monkeypatch):
    monkeypatch.setenv("BURJIT_CACHE_DIR", str(tmp_path))
    x = np.linspace(-1, 1, 50)
    g = _graph(lambda x: F.tanh(x) * 3.0, x)
    first = build(g)
    assert not first.from_cache and cache.path(first.key).exists()
    second = build(g)
    assert second.from_cache and second.key == first.key
    np.testing.assert_array_equal(second([x])[0], first([x])[0])
    for damage in (lambda b: b[: len(b) // 2], lambda b: b[:-1] + bytes([b[-1] ^ 1]), lambda b: b"junk"):
        p = cache.path(first.key)
        p.write_bytes(damage(p.read_bytes()))
        again = build(g)
        assert not again.from_cache
        np.testing.assert_allclose(again([x])[0], np.tanh(x) * 3.0, rtol=1e-14)
        assert build(g).from_cache  # rewritten whole
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_the_step_function_is_optimised_only_when_it_computes(monkeypatch):
    monkeypatch.setenv("BURJIT_TIER", "straight")
    x = np.linspace(-1, 1, 50)
    calls_only = build(_graph(lambda x: F.tanh(x) * 3.0, x))._emitted()
    assert [levels for _, levels in calls_only] == [objects.CALLS, objects.ENTRY]
    assert "@\"burjit_step\"(" in calls_only[0][0] and "@\"burjit_entry\"(" in calls_only[1][0]
    a, b = np.asarray(-4.0), np.asarray(2.0)
    expression = burjit.value_and_grad(lambda a, b: (a * b + b ** 3.0) * (a + 1.0) / (b - 3.0), argnums=(0, 1))
    straight = build(_graph(expression, a, b))
    assert [levels for _, levels in straight._emitted()] == [objects.STRAIGHT, objects.ENTRY]
    assert straight.lowering.inline > objects.CALLS_INLINE
    want = burjit.pytree.flatten(burjit.compile(expression, backend="reference")(a, b))[0]
    np.testing.assert_allclose(np.array(straight([a, b]), float), np.array(want, float), rtol=1e-15)


def _foreign_objects():
    """Object code under a valid cache header and checksum that must still never reach MCJIT."""
    stub = "define i32 @burjit_step(ptr %a) {\n ret i32 0\n}\ndefine ptr @burjit_entry(ptr %a, ptr %b, i64 %c) {\n ret ptr null\n}"
    own = engine.emit_object(engine.parse(stub))
    other = (183 if own[18:20] != (183).to_bytes(2, "little") else 62).to_bytes(2, "little")  # AArch64 or x86-64
    i386 = llvm.Target.from_triple("i386-pc-linux-gnu").create_target_machine()
    return {"i386": i386.emit_object(engine.parse(stub)), "other machine": own[:18] + other + own[20:],
            "no symbols": engine.emit_object(engine.parse(""))}


@pytest.mark.parametrize("kind", ["i386", "other machine", "no symbols"])
def test_cache_entry_of_foreign_object_code_is_a_miss(tmp_path, monkeypatch, kind):
    monkeypatch.setenv("BURJIT_CACHE_DIR", str(tmp_path))
    x = np.linspace(-1, 1, 50)
    g = _graph(lambda x: F.tanh(x) * 3.0, x)
    k = build(g).key
    cache.store(k, _foreign_objects()[kind])
    assert cache.load(k) is not None  # the entry itself is intact
    again = build(g)
    assert not again.from_cache
    np.testing.assert_allclose(again([x])[0], np.tanh(x) * 3.0, rtol=1e-14)
    assert build(g).from_cache  # replaced by the host's own code


def test_cache_in_a_directory_others_can_write_is_not_read(tmp_path, monkeypatch):
    monkeypatch.setenv("BURJIT_CACHE_DIR", str(tmp_path))
    g = _graph(lambda x: x * 2.0, np.ones(3))
    assert not build(g).from_cache and build(g).from_cache
    tmp_path.chmod(0o777)
    with pytest.warns(RuntimeWarning, match="writable by you alone"):
        assert not build(g).from_cache
    assert not build(g).from_cache  # warned once
    tmp_path.chmod(0o700)
    assert build(g).from_cache


def test_cache_key_covers_plan_and_poison(tmp_path, monkeypatch):
    monkeypatch.setenv("BURJIT_CACHE_DIR", str(tmp_path))
    x = np.ones(8)
    g = _graph(lambda x: F.exp(x) + 1.0, x)
    planned, unfused = pipeline.run(g), pipeline.run(g, ["simplify"])
    keys = {build(planned).key, build(unfused).key}
    monkeypatch.setenv("BURJIT_POISON_ARENA", "1")
    keys.add(build(planned).key)
    assert len(keys) == 3


def _kernel_sources(step):
    return {k["symbol"]: k["source"] for k in step.stats()["per_kernel"]}


def test_kernels_are_cached_one_by_one_across_steps_and_programs(tmp_path, monkeypatch):
    monkeypatch.setenv("BURJIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(objects, "_MEMORY", {})
    x = np.linspace(-1, 1, 50)
    first = _kernel_sources(build(_graph(lambda x: F.tanh(x) * 3.0, x)))
    assert set(first.values()) == {"compiled"}
    for program, source in ((lambda x: (F.tanh(x) * 3.0, F.exp(x) - x), "memory"),  # another program
                            (lambda x: (F.tanh(x) * 3.0, F.sqrt(F.abs(x))), "disk")):
        if source == "disk":
            monkeypatch.setattr(objects, "_MEMORY", {})  # as in a new process: the disk alone
        step = build(_graph(program, x))
        sources = _kernel_sources(step)
        assert {sources[k] for k in first} == {source}
        assert step.stats()["kernels_compiled"] == len(sources) - len(first) > 0
    tanh3, _ = step([x])
    np.testing.assert_allclose(tanh3, np.tanh(x) * 3.0, rtol=1e-14)


def test_a_corrupt_kernel_entry_is_recompiled(tmp_path, monkeypatch):
    monkeypatch.setenv("BURJIT_CACHE_DIR", str(tmp_path))
    x = np.linspace(-1, 1, 50)
    g = _graph(lambda x: (F.tanh(x) * 3.0, F.exp(x) - x), x)
    built = build(g)
    built._emitted()
    texts = list(built.lowering.kernels.values())
    assert len(texts) >= 2
    for i, text in enumerate(texts):
        damage = (lambda b: b[:-1] + bytes([b[-1] ^ 1])) if i % 2 else (lambda b: b[:40])
        p = cache.path(objects.kernel_key(text))
        p.write_bytes(damage(p.read_bytes()))
    monkeypatch.setattr(objects, "_MEMORY", {})
    again = build(g)  # its step entry names kernels that are gone: a miss
    assert not again.from_cache and set(_kernel_sources(again).values()) == {"compiled"}
    tanh3, expx = again([x])
    np.testing.assert_allclose(tanh3, np.tanh(x) * 3.0, rtol=1e-14)
    np.testing.assert_allclose(expx, np.exp(x) - x, rtol=1e-14)
    monkeypatch.setattr(objects, "_MEMORY", {})
    assert build(g).from_cache  # the kernels were rewritten whole


def test_a_step_entry_that_is_not_ours_is_a_miss(tmp_path, monkeypatch):
    monkeypatch.setenv("BURJIT_CACHE_DIR", str(tmp_path))
    g = _graph(lambda x: F.tanh(x) * 3.0, np.ones(9))
    k = build(g).key
    for junk in (b'[["a", "b"]]\n', b'{"a": 1}\n', b"[1]\n", b"[]"):
        cache.store(k, junk)
        assert not build(g).from_cache
    assert build(g).from_cache


def test_kernel_identity_check_catches_two_kernels_under_one_identity(monkeypatch):
    """BURJIT_CHECK_KERNELS=1 (the suite's setting) builds every call's IR and compares."""
    monkeypatch.setenv("BURJIT_CHECK_KERNELS", "1")
    monkeypatch.setattr(lowering, "_KNOWN", {})
    monkeypatch.setattr(Program, "signature", lambda self, slot: "one identity for every program")
    with pytest.raises(AssertionError, match="stands for two different kernels"):
        build(_graph(lambda a, b: (F.exp(a), F.tanh(b)), np.ones(16), np.ones(16)))  # kernels: past INLINE_ELEMENTS


# -- index errors: raise before anything a caller can see is written ------------------------------

def _sgd_take_step(idx_fn):
    @burjit.compile(donate_argnums=0)
    def step(p, idx):
        loss, grad = burjit.value_and_grad(lambda p: F.sum(F.take(p["table"], idx_fn(idx)) * p["w"]))(p)
        return {k: p[k] - 0.1 * grad[k] for k in p}, loss
    return step


@pytest.mark.parametrize("bad", [10, -1])
@pytest.mark.parametrize("computed", [False, True])
def test_index_out_of_range_raises_and_leaves_buffers_untouched(bad, computed):
    step = _sgd_take_step((lambda i: F.maximum(i, -5)) if computed else (lambda i: i))
    p = {"table": np.arange(20.0).reshape(10, 2), "w": np.ones(2)}
    good = np.array([1, 2, 9], dtype=np.int64)
    step(p, good)
    low = step.lower(p, good).executable.lowering
    assert [k is None for _, _, k in low.errors] == [computed, computed]  # take and its scatter_add adjoint
    assert bool(low.backup) == computed  # in-place updates of donated buffers are restored on failure
    before = {k: v.copy() for k, v in p.items()}
    with pytest.raises(IndexError, match="out of range"):
        step(p, np.array([1, bad, 3], dtype=np.int64))
    for k in p:
        assert p[k].tobytes() == before[k].tobytes()
    step(p, good)  # still usable afterwards
    assert not np.array_equal(p["table"], before["table"])


def test_threads_sharing_a_checked_step_run_it_one_at_a_time():
    """The checked path fills a shared argv from Python: without the lock another thread's
    arrays are swapped in between the fill and the native call."""
    step = _sgd_take_step(lambda i: F.maximum(i, -5))
    idx = np.array([1, 2, 9], dtype=np.int64)
    params = lambda t: {"table": np.arange(20.0).reshape(10, 2) * (t + 1), "w": np.full(2, t + 1.0)}
    assert step.lower(params(0), idx).executable.lowering.backup  # the checked (ctypes) path

    def run(t, out):
        p = params(t)
        out.extend(float(step(p, idx)[1]) for _ in range(300))
    want, got = [[] for _ in range(4)], [[] for _ in range(4)]
    for t in range(4):
        run(t, want[t])
    interval = sys.getswitchinterval()
    threads = [threading.Thread(target=run, args=(t, got[t])) for t in range(4)]
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(interval)
    assert got == want


def test_in_place_update_before_a_failing_computed_index_is_undone():
    @burjit.compile(donate_argnums=0)
    def step(p, idx):
        new = {"w": p["w"] * 2.0}
        return new, F.take(new["w"], F.maximum(idx, -5))  # the take runs after w is updated in place
    p = {"w": np.arange(4.0)}
    assert step.lower(p, np.array([0])).executable.lowering.backup == [0]
    with pytest.raises(IndexError):
        step(p, np.array([7]))
    np.testing.assert_array_equal(p["w"], np.arange(4.0))
    np.testing.assert_array_equal(step(p, np.array([3]))[1], [6.0])


def test_constant_index_out_of_range_raises_at_every_call():
    step = burjit.compile(lambda t: F.take(t, np.array([0, 5])))
    with pytest.raises(IndexError, match="index 5"):
        step(np.zeros((3, 2)))
    with pytest.raises(IndexError):
        step(np.zeros((3, 2)))


def test_scatter_add_index_checked():
    step = burjit.compile(lambda t, i: burjit.grad(lambda t: F.sum(F.take(t, i)))(t))
    np.testing.assert_array_equal(step(np.zeros(4), np.array([3, 3, 0])), [1, 0, 0, 2])
    with pytest.raises(IndexError):
        step(np.zeros(4), np.array([4]))


# -- memory -----------------------------------------------------------------------------------

def test_poison_exposes_a_plan_that_overlaps_live_values(monkeypatch):
    x = np.linspace(0, 1, 16)
    g = pipeline.prepare(pipeline.run(_graph(lambda x: F.exp(x) * 2.0 + 1.0, x), ["simplify"]))  # one slot per op
    mem = g.meta["memory"]
    arena = sorted((n for n, loc in mem.location.items() if loc[0] == "arena"), key=g.topo().index)
    assert len(arena) >= 2
    np.testing.assert_allclose(build(g)([x])[0], np.exp(x) * 2.0 + 1.0)
    monkeypatch.setenv("BURJIT_POISON_ARENA", "1")
    np.testing.assert_allclose(build(g)([x])[0], np.exp(x) * 2.0 + 1.0)  # a sound plan survives poison
    # exp(x) and exp(x) * 2 share bytes: element-for-element this happens to work, unless poisoned.
    bad = g.copy()
    bad.meta["memory"] = type(mem)(dict(mem.location), mem.arena_bytes)
    bad.meta["memory"].location[arena[1]] = mem.location[arena[0]]
    assert np.isnan(build(bad)([x])[0]).all()


def test_memory_plan_report():
    step = burjit.compile(lambda x: F.sum(F.tanh(x @ x) * 2.0))
    step(np.ones((8, 8)))
    r = step.memory_plan()
    assert {"arena_bytes", "naive_bytes", "lower_bound", "arena_allocated", "kernels", "locations"} <= set(r)
    assert r["arena_allocated"] >= r["arena_bytes"]


def test_donated_swap_goes_through_staging():
    @burjit.compile(donate_argnums=(0, 1))
    def swap(a, b):
        return b, a
    a, b = np.arange(3.0), np.arange(3.0) + 10
    ra, rb = swap(a, b)
    assert ra is a and rb is b
    np.testing.assert_array_equal(a, [10, 11, 12])
    np.testing.assert_array_equal(b, [0, 1, 2])


def test_outputs_that_are_constants_inputs_or_repeats():
    step = burjit.compile(lambda x: (F.zeros_like(x), x, F.arange(3), np.array([1.5, 2.5]), x * 2.0, x * 2.0, F.ones_like(x, "bool")))
    x = np.arange(3.0)
    z, same, r, lit, d1, d2, t = step(x)
    np.testing.assert_array_equal(z, 0)
    assert same is not x and np.array_equal(same, x)
    np.testing.assert_array_equal(r, [0, 1, 2])
    np.testing.assert_array_equal(lit, [1.5, 2.5])
    np.testing.assert_array_equal(d1, d2)
    assert d1 is not d2 and t.dtype == bool and t.all()
    z1, z2 = burjit.compile(lambda x: (F.zeros_like(x), F.zeros_like(x)))(x)  # CSE folds them into one node
    assert z1 is not z2 and not z1.any() and not z2.any()
    unused = burjit.compile(burjit.grad(lambda x, y, z: F.sum(x), argnums=(1, 2)))(x, np.ones(2), np.ones(2))
    assert [g.tolist() for g in unused] == [[0.0, 0.0], [0.0, 0.0]]


@pytest.mark.parametrize("layouts_known", [True, False])
def test_fast_entry_and_portable_path_agree(layouts_known, monkeypatch):
    from burjit.codegen import abi
    if not layouts_known:
        monkeypatch.setattr(abi, "OFFSETS", None)
    elif abi.OFFSETS is None:
        pytest.skip("this Python's object layouts were not recognised")
    x, i = np.arange(6.0), np.array([5, 0])
    exe = build(_graph(lambda t, i: (F.take(t, i) * 2.0, t + 1.0), x, i))
    assert (type(exe) is NativeExecutable) == layouts_known
    out = exe((x, i))
    np.testing.assert_array_equal(out[0], [10.0, 0.0])
    np.testing.assert_array_equal(out[1], x + 1.0)
    with pytest.raises(IndexError, match="index 6 is out of range"):
        exe([x, np.array([6])])


def test_the_entry_builtin_keeps_its_def_and_code_alive_without_its_executable():
    """CPython reads a builtin's method def when it traverses or frees it, and jit.py's fast path
    holds the builtin in a reference cycle with the executable, collected in any order (at
    shutdown too): the builtin itself must own its def and the engine holding its code."""
    import gc
    import weakref
    from burjit.codegen import abi
    if abi.OFFSETS is None:
        pytest.skip("this Python's object layouts were not recognised: no entry builtin")
    x = np.arange(4.0)
    exe = build(_graph(lambda t: t * 2.0, x))
    entry, arena, engine_alive = exe._call, exe._arena, weakref.ref(exe._loaded)
    gone = weakref.ref(exe)
    del exe
    gc.collect()
    assert gone() is None and engine_alive() is not None and entry.__name__ == lowering.ENTRY
    out = [np.empty(4)]
    assert entry([x], out, arena) is out
    np.testing.assert_array_equal(out[0], x * 2.0)
    del entry
    gc.collect()
    assert engine_alive() is None  # nothing else keeps the code


# -- inspection -------------------------------------------------------------------------------

def test_dump_dir_writes_ir_and_assembly(tmp_path, monkeypatch):
    monkeypatch.setenv("BURJIT_DUMP_DIR", str(tmp_path))
    step = burjit.compile(lambda x: x * 3.0)
    step(np.ones(5))
    names = sorted(p.suffixes[-1] for p in tmp_path.iterdir())
    assert names == [".ll", ".ll", ".mlir", ".s"]
    assert "burjit_step" in step.llvm_ir() and "burjit_step" in step.asm()
    assert isinstance(step.lower(np.ones(5)).executable, NativeExecutable)


def test_dump_dir_that_is_a_file_warns_and_the_step_runs(tmp_path, monkeypatch):
    (tmp_path / "f").write_text("mine")
    monkeypatch.setenv("BURJIT_DUMP_DIR", str(tmp_path / "f"))
    with pytest.warns(RuntimeWarning, match="dump skipped"):
        np.testing.assert_array_equal(burjit.compile(lambda x: x * 3.0)(np.ones(2)), [3.0, 3.0])
    assert (tmp_path / "f").read_text() == "mine"


# -- training matches the reference ----------------------------------------------------------------

def _mlp(params, x, act):
    for i, layer in enumerate(params):
        x = x @ layer["w"] + layer["b"]
        x = act(x) if i < len(params) - 1 else x
    return x


def _train(backend, params, x, y, act, steps):
    @burjit.compile(backend=backend, donate_argnums=0)
    def step(params, x, y):
        loss, g = burjit.value_and_grad(lambda p: F.mean((_mlp(p, x, act) - y) ** 2.0))(params)
        return [{k: p[k] - 0.05 * gp[k] for k in p} for p, gp in zip(params, g)], loss
    losses = [float(step(params, x, y)[1]) for _ in range(steps)]
    return params, losses


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_tensor_mlp_trains_like_the_reference(dtype):
    rng = np.random.default_rng(0)
    sizes = [3, 16, 16, 1]
    params = [{"w": rng.normal(size=(m, n)).astype(dtype) / np.sqrt(m), "b": np.zeros(n, dtype)}
              for m, n in zip(sizes, sizes[1:])]
    x, y = rng.normal(size=(24, 3)).astype(dtype), rng.normal(size=(24, 1)).astype(dtype)
    copy = [{k: v.copy() for k, v in layer.items()} for layer in params]
    got, got_losses = _train("native", params, x, y, F.tanh, 30)
    want, want_losses = _train("reference", copy, x, y, F.tanh, 30)
    tol = 1e-10 if dtype == "float64" else 2e-4
    np.testing.assert_allclose(got_losses, want_losses, rtol=tol)
    assert got_losses[-1] < got_losses[0]
    for a, b in zip(got, want):
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=tol, atol=tol)


def test_scalar_mlp_trains_like_the_reference():
    """micrograd style: every weight is its own 0-d value, so the step is one big scalar graph."""
    rng = np.random.default_rng(1)
    sizes = [2, 4, 4, 1]
    params = [{"w": [[np.float64(rng.uniform(-1, 1)) for _ in range(n)] for _ in range(m)],
               "b": [np.float64(0.0) for _ in range(n)]} for m, n in zip(sizes, sizes[1:])]
    data = [(rng.normal(size=2), float(rng.choice([-1.0, 1.0]))) for _ in range(6)]

    def model(p, x):
        h = list(x)
        for i, layer in enumerate(p):
            h = [sum((h[r] * layer["w"][r][c] for r in range(len(h))), layer["b"][c]) for c in range(len(layer["b"]))]
            h = [F.relu(v) for v in h] if i < len(p) - 1 else h
        return h[0]

    def step(p):
        loss, g = burjit.value_and_grad(lambda p: sum(F.relu(1.0 - y * model(p, x)) for x, y in data) / len(data))(p)
        return burjit.pytree.tree_map(lambda a, b: a - 0.1 * b, p, g), loss

    native, ref = burjit.compile(step, backend="native"), burjit.compile(step, backend="reference")
    p_n = p_r = params
    for _ in range(5):
        (p_n, l_n), (p_r, l_r) = native(p_n), ref(p_r)
        np.testing.assert_allclose(l_n, l_r, rtol=1e-12)
    for a, b in zip(burjit.pytree.flatten(p_n)[0], burjit.pytree.flatten(p_r)[0]):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
