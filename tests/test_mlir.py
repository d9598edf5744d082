"""MLIR: the emitted step verifies with mlir-opt, and the mlir backend (a second code generator)
agrees with the reference on random programs and the models; its failing steps change nothing.
The backend's per-op and per-model differential tests run through the `backend` fixture too."""

import numpy as np
import pytest
from hypothesis import given

import burjit
from burjit import ops as F
from burjit.codegen import mlir_backend

from conftest import need_mlir_tools
from test_passes_programs import MODELS, ops_lists, program


@pytest.fixture(autouse=True)
def tools():
    need_mlir_tools()


def _agree(step, args, donate=(), rtol=1e-9, atol=1e-12):
    copy = lambda: burjit.pytree.tree_map(np.copy, args)  # noqa: E731  (donated arrays are overwritten)
    want = burjit.compile(step, backend="reference", donate_argnums=donate)(*copy())
    got = burjit.compile(step, backend="mlir", donate_argnums=donate)(*copy())
    for a, b in zip(burjit.pytree.flatten(got)[0], burjit.pytree.flatten(want)[0], strict=True):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


@given(ops_lists)
def test_random_programs_agree_with_the_reference(ops):
    _agree(*program(ops), donate=0)


@pytest.mark.parametrize("name", MODELS)
def test_the_models_agree_with_the_reference(name):
    step, args = MODELS[name]()
    _agree(step, args, donate=(0, 1) if name == "gpt" else 0, rtol=2e-4, atol=1e-6)  # float32


@pytest.mark.parametrize("name", MODELS)
def test_the_native_steps_mlir_verifies_and_names_the_users_lines(name, tmp_path):
    step, args = MODELS[name]()
    compiled = burjit.compile(step)
    compiled(*burjit.pytree.tree_map(np.copy, args))
    text = compiled.mlir()
    opt, _ = mlir_backend.tools()
    mlir_backend.run_tool(opt, ["--verify-diagnostics"], text)  # raises with mlir-opt's message
    assert "linalg.generic" in text and ("linalg.matmul" in text or "linalg.batch_matmul" in text)
    assert 'loc("' in text and "test_passes_programs.py" in text


def test_a_computed_index_out_of_range_raises_and_leaves_donated_buffers_alone():
    step = burjit.compile(lambda p, i: (p * 2.0, F.take(p, i + 1)), backend="mlir", donate_argnums=0)
    p = np.arange(3.0)
    assert step(p, np.array([0, 1]))[1].tolist() == [1.0, 2.0] and p.tolist() == [0.0, 2.0, 4.0]
    with pytest.raises(IndexError, match=r"computed in the step is out of range for an axis of size 3 \(take at .*test_mlir.py"):
        step(p, np.array([2]))
    assert p.tolist() == [0.0, 2.0, 4.0]


def test_dump_dir_writes_the_mlir_beside_the_llvm_ir(tmp_path, monkeypatch):
    monkeypatch.setenv("BURJIT_DUMP_DIR", str(tmp_path))
    burjit.compile(lambda x: F.tanh(x) * 2.0)(np.ones(3))
    (dumped,) = tmp_path.glob("*.mlir")
    assert "math.tanh" in dumped.read_text() and dumped.with_suffix(".ll").exists()


def test_missing_tools_say_how_to_install_them(tmp_path, monkeypatch):
    monkeypatch.setenv("BURJIT_MLIR_TOOLS", str(tmp_path))
    with pytest.raises(mlir_backend.MissingTools, match="apt-get install mlir-19-tools"):
        burjit.compile(lambda x: x + 1.0, backend="mlir")(np.ones(2))


def test_loops_are_functions_called_from_scf_and_verify():
    def f(w, xs, n):
        c, ys = burjit.scan(lambda c, x: (F.tanh(c * w + x), F.sum(c)), w * 0.0, xs, reverse=True)
        k, v = burjit.while_loop(lambda s: s[0] < n, lambda s: (s[0] + 1, s[1] * 0.5), (np.int64(0), c))
        return v, ys, k  # the while loop's carry mixes int64 and float64: a packed vector, bitcast
    compiled = burjit.compile(f)
    args = (np.linspace(0.1, 0.3, 3), np.arange(12.0).reshape(4, 3) / 10, np.int64(3))
    compiled(*args)
    text = compiled.mlir()
    mlir_backend.run_tool(mlir_backend.tools()[0], ["--verify-diagnostics"], text)
    assert text.count("func.func private @step_loop") == 2 and "scf.for" in text and "scf.while" in text
    _agree(f, args)


def test_a_bad_index_ends_a_while_loop_that_clamping_would_keep_running():
    # row 0 (where a bad index reads) adds nothing: without the status check the loop never ends
    step = burjit.compile(lambda t, i: burjit.while_loop(lambda c: c < 3.0, lambda c: c + F.take(t, i), 0.0),
                          backend="mlir")
    t = np.array([0.0, 1.0])
    assert float(step(t, np.int64(1))) == 3.0
    with pytest.raises(IndexError, match=r"out of range for an axis of size 2.*in the loop at .*test_mlir.py"):
        step(t, np.int64(7))


def test_a_tape_tier_steps_scalar_region_is_emitted_as_straight_line_code_that_verifies():
    def f(x):
        s = x[0]
        for i in range(2100):  # 4,200 scalar ops: past REGION_OPS, one region node on the tape tier
            s = F.tanh(s * x[1] + x[2]) if i % 7 == 0 else s * 0.999 + x[i % 3]
        return s
    compiled = burjit.compile(f, tier="tape")
    x = np.array([0.3, 0.2, 0.1])
    compiled(x)
    graph = compiled.graph(x)
    assert [graph[n]["op"] for n in graph.nx.nodes].count("region") == 1
    text = compiled.mlir()
    mlir_backend.run_tool(mlir_backend.tools()[0], ["--verify-diagnostics"], text)
    assert text.count("math.tanh") == 300 and "test_mlir.py" in text
