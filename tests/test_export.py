"""burjit.export (burjit/export.py, codegen/export.py): a step as a C library, called from ctypes
and from a C program built with cc against its header, against the compiled step in Python."""

import ctypes
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import burjit
from burjit import ops as F
from burjit.arena import zeroed


def _tiny(x):
    a, b = x[0], x[1]
    c = a + b
    d = a * b + b ** 3
    e = c - d
    return (e ** 2) / 2.0


def _sgd(p, idx, y):
    """A donated training step gathering rows by an index input (which may be out of range)."""
    def loss(p):
        h = F.tanh(F.take(p["emb"], idx) @ p["w"])
        return F.mean((h - y) ** 2)
    v, g = burjit.value_and_grad(loss)(p)
    return {k: p[k] - 0.1 * g[k] for k in p}, v


def _params():
    rng = np.random.default_rng(0)
    return {"emb": rng.normal(size=(5, 3)), "w": rng.normal(size=(3, 2))}


def _arena(desc):
    return zeroed(desc["arena_bytes"], desc["arena_align"])


def _call(lib, desc, inputs, arena=None):
    """Run the library's step on numpy inputs (in a fresh arena unless given one); (rc, outputs),
    outputs written into donated inputs included."""
    outs = [np.zeros(o["shape"], o["dtype"]) for o in desc["outputs"]]
    arena = _arena(desc) if arena is None else arena
    argv = (ctypes.c_void_p * (len(inputs) + len(outs) + 1))(*[a.ctypes.data for a in inputs + outs + [arena]])
    fn = getattr(lib, desc["symbol"])
    fn.restype = ctypes.c_int32
    rc = fn(argv)
    return rc, [inputs[o["written_into_input"]] if o["written_into_input"] is not None else x
                for o, x in zip(desc["outputs"], outs)]


def test_an_exported_step_gives_the_compiled_steps_bits(tmp_path):
    step = burjit.compile(burjit.value_and_grad(_tiny), tier="straight")
    x = np.array([-41.0, 2.0])
    files = burjit.export(step, x, path=tmp_path / "tiny")
    assert {k: p.exists() for k, p in files.items()} == {"o": True, "h": True, "json": True, "so": True}
    desc = json.loads(files["json"].read_text())
    assert [i["shape"] for i in desc["inputs"]] == [[2]] and [o["shape"] for o in desc["outputs"]] == [[], [2]]
    rc, (v, g) = _call(ctypes.CDLL(str(files["so"])), desc, [x.copy()])
    want_v, want_g = step(x)
    assert rc == 0 and v.tobytes() == want_v.tobytes() and g.tobytes() == want_g.tobytes()
    assert "#define TINY_ARENA_BYTES" in files["h"].read_text()


def test_a_donated_training_step_from_c_matches_python_and_an_error_changes_no_parameter(tmp_path):
    step = burjit.compile(_sgd, donate_argnums=0, tier="straight")
    idx, y = np.array([0, 3, 4]), np.ones((3, 2)) * 0.5
    files = burjit.export(step, _params(), idx, y, path=tmp_path / "sgd")
    desc = json.loads(files["json"].read_text())
    assert [o["written_into_input"] for o in desc["outputs"]] == [0, 1, None]
    lib = ctypes.CDLL(str(files["so"]))
    p_c, p_py = _params(), _params()
    leaves = [p_c["emb"], p_c["w"]]
    for _ in range(5):
        rc, (emb, w, v) = _call(lib, desc, leaves + [idx, y])
        assert rc == 0 and emb is leaves[0]
        p_py, v_py = step(p_py, idx, y)
    assert p_c["emb"].tobytes() == p_py["emb"].tobytes() and p_c["w"].tobytes() == p_py["w"].tobytes()
    assert v.tobytes() == np.asarray(v_py).tobytes()
    before = [a.copy() for a in leaves]
    rc, _ = _call(lib, desc, leaves + [np.array([0, 7, 1]), y])
    assert rc > 0 and rc in [e["code"] for e in desc["errors"]]
    assert all(a.tobytes() == b.tobytes() for a, b in zip(leaves, before))
    assert f"SGD_ERROR_{rc}" in files["h"].read_text()


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this machine")
def test_a_c_program_built_against_the_header_runs_the_step(tmp_path):
    step = burjit.compile(burjit.value_and_grad(_tiny), tier="straight")
    burjit.export(step, np.array([-41.0, 2.0]), path=tmp_path / "tiny")
    (tmp_path / "main.c").write_text("""
#include <stdio.h>
#include <stdlib.h>
#include "tiny.h"
int main(void) {
    double x[TINY_INPUT_0_SIZE] = {-41.0, 2.0}, v[TINY_OUTPUT_0_SIZE], g[TINY_OUTPUT_1_SIZE];
    void *arena = aligned_alloc(TINY_ARENA_ALIGN, (TINY_ARENA_BYTES + TINY_ARENA_ALIGN - 1) / TINY_ARENA_ALIGN * TINY_ARENA_ALIGN);
    void *argv[TINY_N_INPUTS + TINY_N_OUTPUTS + 1] = {x, v, g, arena};
    for (int i = 0; i < TINY_ARENA_BYTES; i++) ((char *)arena)[i] = 0;
    int rc = tiny_step(argv);
    printf("%d %.17g %.17g %.17g\\n", rc, v[0], g[0], g[1]);
    return rc;
}
""")
    subprocess.run(["cc", "-O1", "-o", "main", "main.c", "tiny.so", "-Wl,-rpath,$ORIGIN"], cwd=tmp_path, check=True)
    out = subprocess.run([str(tmp_path / "main")], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["0", "612.5", "-35", "1050"]


def test_export_refuses_what_it_cannot_honour(tmp_path):
    x = np.array([-41.0, 2.0])
    with pytest.raises(ValueError, match="cannot export; use the native backend"):
        burjit.export(burjit.compile(_tiny, backend="reference"), x, path=tmp_path / "a")
    looped = burjit.compile(lambda x: burjit.fori_loop(0, 3, lambda i, c: c * 2.0, x))
    with pytest.raises(ValueError, match="it holds a loop"):
        burjit.export(looped, np.ones(8), path=tmp_path / "b")
    with pytest.raises(ValueError, match="tape tier"):
        burjit.export(burjit.compile(burjit.value_and_grad(_tiny), tier="tape"), x, path=tmp_path / "t")
    with pytest.raises(ValueError, match="must be a C identifier"):
        burjit.export(burjit.compile(_tiny, tier="straight"), x, path=tmp_path / "not-a-name")
    with pytest.raises(ValueError, match="static"):
        burjit.export(burjit.compile(lambda x, k: x * k, static_argnums=1), x, 2.0, path=tmp_path / "c")
    with pytest.raises(ValueError, match="Python scalar"):
        burjit.export(burjit.compile(lambda x, k: x * k), x, 2.0, path=tmp_path / "d")
    with pytest.raises(TypeError, match="compile'd step"):
        burjit.export(_tiny, x, path=tmp_path / "e")
    assert not list(tmp_path.iterdir())  # a refused export writes nothing


def test_without_a_c_compiler_the_object_code_is_left_and_named(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "no-such-cc-burjit")
    with pytest.raises(RuntimeError, match=r"no C compiler .*tiny\.o holds the step's object code"):
        burjit.export(burjit.compile(_tiny, tier="straight"), np.array([-41.0, 2.0]), path=tmp_path / "tiny")
    assert (tmp_path / "tiny.o").stat().st_size > 0 and not (tmp_path / "tiny.so").exists()


@pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None, reason="no cc or make on this machine")
def test_the_c_example_builds_with_one_make_and_trains_as_the_python_step_does(tmp_path):
    example = Path(__file__).resolve().parent.parent / "examples" / "export_c"
    subprocess.run(["make", "-C", str(example), f"BUILD={tmp_path}", f"PYTHON={sys.executable}"], check=True,
                   capture_output=True)
    c = subprocess.run([str(tmp_path / "train")], capture_output=True, text=True, check=True).stdout.splitlines()
    py = subprocess.run([sys.executable, str(example / "export.py"), str(tmp_path / "py"), "--python"],
                        capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(c) == 100 and c == py  # 17 significant digits: the same doubles, bit for bit
    assert float(c[-1].split()[-1]) >= 0.95  # and it learned


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this machine")
def test_a_step_calling_libm_links_into_a_c_program_that_names_only_the_library(tmp_path):
    step = burjit.compile(burjit.value_and_grad(lambda x, y: F.sum(F.exp(x) * F.log(y) + x ** y)), tier="straight")
    x = np.linspace(0.1, 1.0, 8)
    burjit.export(step, x, x + 1.0, path=tmp_path / "mathy")
    (tmp_path / "main.c").write_text("""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mathy.h"
int main(void) {
    double x[MATHY_INPUT_0_SIZE], y[MATHY_INPUT_1_SIZE], v, g[MATHY_OUTPUT_1_SIZE];
    for (int i = 0; i < MATHY_INPUT_0_SIZE; i++) { x[i] = 0.1 + 0.9 * i / 7; y[i] = x[i] + 1.0; }
    void *arena = aligned_alloc(MATHY_ARENA_ALIGN, 4096 + MATHY_ARENA_BYTES / MATHY_ARENA_ALIGN * MATHY_ARENA_ALIGN);
    memset(arena, 0, MATHY_ARENA_BYTES);
    void *argv[] = {x, y, &v, g, arena};
    int rc = mathy_step(argv);
    printf("%d %.17g %.17g\\n", rc, v, g[7]);
    return rc;
}
""")
    subprocess.run(["cc", "-O1", "-o", "main", "main.c", "mathy.so", "-Wl,-rpath,$ORIGIN"], cwd=tmp_path, check=True)
    out = subprocess.run([str(tmp_path / "main")], capture_output=True, text=True, check=True).stdout.split()
    v, g = step(x, x + 1.0)
    assert out == ["0", f"{float(v):.17g}", f"{g[7]:.17g}"]


def test_threads_with_an_arena_each_share_one_library(tmp_path):
    """ctypes releases the GIL during the call, so the threads' steps really overlap."""
    import threading
    step = burjit.compile(_sgd, donate_argnums=0, tier="straight")
    idx, y = np.array([0, 3, 4]), np.ones((3, 2)) * 0.5
    files = burjit.export(step, _params(), idx, y, path=tmp_path / "sgd")
    desc, lib = json.loads(files["json"].read_text()), ctypes.CDLL(str(files["so"]))
    serial = [_params()["emb"], _params()["w"]]
    for _ in range(300):
        _call(lib, desc, serial + [idx, y])
    results = []

    def train():  # each thread with its own arena, kept across its calls
        leaves, arena = [_params()["emb"], _params()["w"]], _arena(desc)
        assert not any(_call(lib, desc, leaves + [idx, y], arena)[0] for _ in range(300))
        results.append(leaves)
    threads = [threading.Thread(target=train) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2 and all(a.tobytes() == b.tobytes() for r in results for a, b in zip(r, serial))
