"""burjit.load (burjit/library.py): an exported step called from Python without the compiler,
against the compiled step; what it refuses before running any of the library's code."""

import json
import subprocess
import sys
from collections import namedtuple

import numpy as np
import pytest

import burjit
from burjit import library
from test_export import _params, _sgd


IDX, Y = np.array([0, 3, 4]), np.full((3, 2), 0.5)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    step = burjit.compile(_sgd, donate_argnums=0, tier="straight")
    path = tmp_path_factory.mktemp("lib") / "sgd"
    burjit.export(step, _params(), IDX, Y, path=path)
    return step, path


def test_a_loaded_step_trains_as_the_compiled_step_does_and_an_error_changes_nothing(exported):
    step, path = exported
    f = burjit.load(path)
    p_lib, p_py = _params(), _params()
    for _ in range(5):
        emb = p_lib["emb"]
        p_lib, v_lib = f(p_lib, IDX, Y)
        p_py, v_py = step(p_py, IDX, Y)
        assert p_lib["emb"] is emb  # donated: written in place, as the compiled step does
    assert {k: a.tobytes() for k, a in p_lib.items()} == {k: a.tobytes() for k, a in p_py.items()}
    assert np.asarray(v_lib).tobytes() == np.asarray(v_py).tobytes()
    before = {k: a.copy() for k, a in p_lib.items()}
    with pytest.raises(IndexError) as lib_error:
        f(p_lib, np.array([0, 7, 1]), Y)
    with pytest.raises(IndexError) as py_error:
        step(p_py, np.array([0, 7, 1]), Y)
    assert str(lib_error.value) == str(py_error.value) and "index 7" in str(lib_error.value)
    assert all(p_lib[k].tobytes() == before[k].tobytes() for k in before)


def test_loading_and_running_imports_neither_llvm_nor_networkx(exported):
    step, path = exported
    script = f"""
import sys, numpy as np, burjit
f = burjit.load({str(path)!r})
rng = np.random.default_rng(0)
p = {{"emb": rng.normal(size=(5, 3)), "w": rng.normal(size=(3, 2))}}
p, v = f(p, np.array([0, 3, 4]), np.full((3, 2), 0.5))
heavy = sorted({{m.split(".")[0] for m in sys.modules}} & {{"llvmlite", "networkx", "burjit.jit"}})
print(heavy, p["emb"].tobytes().hex(), np.asarray(v).tobytes().hex())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    want, v = step(_params(), IDX, Y)
    assert out == ["[]", want["emb"].tobytes().hex(), np.asarray(v).tobytes().hex()]


def test_arguments_of_another_structure_shape_or_dtype_are_refused(exported):
    f = burjit.load(exported[1])
    with pytest.raises(TypeError, match="structure"):
        f(_params(), IDX)
    with pytest.raises(TypeError, match=r"arg\.0\.w is float64\[2, 2\], the exported step takes float64\[3, 2\]"):
        f({"emb": np.zeros((5, 3)), "w": np.zeros((2, 2))}, IDX, Y)
    with pytest.raises(TypeError, match=r"arg\.1 is int32\[3\]"):
        f(_params(), IDX.astype(np.int32), Y)
    p = _params()
    p["w"] = np.linspace(0, 1, 12).reshape(3, 4)[:, ::2]  # not C order: copied in, the result still right
    p_ref = {"emb": p["emb"].copy(), "w": p["w"].copy()}
    assert not p["w"].flags.c_contiguous and p_ref["w"].flags.c_contiguous
    assert f(p, IDX, Y)[0]["w"].tobytes() == f(p_ref, IDX, Y)[0]["w"].tobytes()


def _copy(path, to):
    to.mkdir()
    for ext in (".so", ".json"):
        (to / (path.name + ext)).write_bytes(path.with_suffix(ext).read_bytes())
    return to / path.name


def test_a_truncated_foreign_or_missing_library_is_refused_before_it_is_opened(exported, tmp_path):
    path = exported[1]
    cut = _copy(path, tmp_path / "cut")
    so = cut.with_suffix(".so")
    so.write_bytes(so.read_bytes()[:1000])
    with pytest.raises(library.LibraryError, match="truncated, rebuilt or replaced"):
        burjit.load(cut)
    other = tmp_path / "other"
    burjit.export(burjit.compile(lambda x: x * 2.0, tier="straight"), np.ones(3), path=other)
    foreign = _copy(path, tmp_path / "foreign")
    foreign.with_suffix(".so").write_bytes(other.with_suffix(".so").read_bytes())
    with pytest.raises(library.LibraryError, match="is not the library"):
        burjit.load(foreign)
    with pytest.raises(library.LibraryError, match="no .*nothing.json"):
        burjit.load(tmp_path / "nothing")
    (tmp_path / "junk.json").write_text("[1, 2]")
    with pytest.raises(library.LibraryError, match="not an exported step's description"):
        burjit.load(tmp_path / "junk")


def test_a_cpu_without_the_librarys_instruction_sets_or_of_another_machine_is_refused(exported, tmp_path, monkeypatch):
    moved = _copy(exported[1], tmp_path / "moved")
    desc = json.loads(moved.with_suffix(".json").read_text())
    used = [f[1:] for f in desc["target"]["features"].split(",") if f.startswith("+") and f[1:] in library.X86_FEATURES]
    assert "sse2" in used
    flags = library._cpu_flags()
    monkeypatch.setattr(library, "_cpu_flags", lambda: flags - {"sse2"})
    with pytest.raises(library.LibraryError, match=r"uses instructions this CPU lacks \(sse2\)"):
        burjit.load(moved)
    monkeypatch.undo()
    desc["target"]["triple"] = "aarch64-unknown-linux-gnu"
    moved.with_suffix(".json").write_text(json.dumps(desc))
    with pytest.raises(library.LibraryError, match="built for aarch64, this machine is x86_64"):
        burjit.load(moved)


def test_a_namedtuple_in_the_step_is_refused_by_export(tmp_path):
    Pair = namedtuple("Pair", "a b")
    step = burjit.compile(lambda x: Pair(x, x * 2.0), tier="straight")
    with pytest.raises(ValueError, match=r"namedtuple \(Pair\)"):
        burjit.export(step, np.ones(2), path=tmp_path / "nt")
    assert not list(tmp_path.iterdir())
