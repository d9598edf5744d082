"""The benchmark harness runs end to end (burjit only: CI has no peers) and its checks can fail.

Nothing here is timed: the assertions are about the shape of what a run writes and about
wrong or slow frameworks being caught, never about how fast anything is. The runs use burjit's
reference backend, so that these tests are about the harness; whether the native backend
computes the right numbers is the subject of its own tests (and of every benchmark run).
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not installed: a plain `pytest`
from benchmarks import check, frameworks, report, run, workloads  # noqa: E402
from benchmarks.frameworks.common import leaves, unflatten  # noqa: E402
from benchmarks.workloads import expression  # noqa: E402

TINY = ["--quick", "--only", "expression", "--rounds", "1", "--round-time", "0.001"]


def _run(tmp_path, *extra):
    rows = run.main(TINY + ["--out", str(tmp_path)] + list(extra))
    return rows, json.loads((tmp_path / "results.json").read_text())


def test_a_run_writes_rows_json_and_markdown(tmp_path):
    rows, data = _run(tmp_path, "--frameworks", "burjit-ref", "--markdown", str(tmp_path / "R.md"))
    assert [r["framework"] for r in data["results"]] == ["burjit-ref"]
    r = data["results"][0]
    assert r["status"] == "ok", r
    assert r["step_s"] > 0 and r["first_call_s"] > 0 and r["overhead_s"] > 0 and r["peak_rss_delta"] >= 0
    assert {"date", "cpu", "command", "versions", "python", "numpy"} <= set(data["meta"])
    assert "reference backend" in data["meta"]["versions"]["burjit-ref"]
    assert "burjit-ref" in (tmp_path / "R.md").read_text()


def test_every_workload_runs_in_quick_mode_with_every_column(tmp_path):
    """The smoke run: each workload's quick case on the reference backend (the GPTs' once, in
    float32), and on the native one the small scalar graphs, whose second, warm build comes
    from the cache the first one filled."""
    fast = ["--rounds", "1", "--round-time", "0.001", "--out", str(tmp_path)]
    rows = run.main(["--quick", "--frameworks", "burjit-ref", "--dtype", "float32"] + fast)
    rows += run.main(["--quick", "--only", "tiny,fastest_autograd", "--frameworks", "burjit"] + fast)
    assert {r["workload"].split()[0] for r in rows} == set(workloads.NAMES)
    for r in rows:
        assert r["status"] == "ok", r
        assert r["step_s"] > 0 and r["import_s"] > 0 and r["cold_compile_s"] >= 0 and r["warm_compile_s"] >= 0
        assert r["peak_rss"] >= r["peak_rss_delta"] >= 0
        assert r["loop_s"] > 0 and r["loop_compile_s"] > 0, r  # k steps in one burjit.fori_loop
    assert [r["workload"] for r in rows[-2:]] == ["tiny", "fastest_autograd n=100"]


def test_ratios_are_against_burjit_in_the_same_case():
    rows = [{"workload": w, "dtype": "float64", "framework": f, "step_s": s}
            for w, f, s in [("a", "burjit", 2.0), ("a", "torch", 6.0), ("b", "torch", 1.0), ("b", "burjit", 4.0)]]
    run.add_ratios(rows)
    assert [r["ratio"] for r in rows] == [1.0, 3.0, 0.25, 1.0]


def test_a_wrong_answer_is_caught_and_not_timed(tmp_path, monkeypatch):
    monkeypatch.setattr(expression, "EXPECTED", {"value": [24.7041], "grad": [138.8338, 645.0]})
    rows, _ = _run(tmp_path, "--frameworks", "burjit-ref")
    assert rows[0]["status"] == "wrong" and "grad[1]" in rows[0]["note"]
    assert "step_s" not in rows[0]


def test_a_slow_framework_times_out_instead_of_hanging(tmp_path):
    rows, _ = _run(tmp_path, "--frameworks", "burjit-ref", "--timeout", "0.01")
    assert rows[0]["status"] == "timeout"


def test_a_missing_or_inapplicable_framework_is_a_row_not_a_crash(tmp_path):
    rows, _ = _run(tmp_path, "--frameworks", "micrograd", "--dtype", "float32")
    assert rows[0]["status"] in ("skipped", "missing")


def test_majority_finds_the_odd_one_out():
    good = {"loss": [1.0], "grad": [0.5, -2.0]}
    bad = {"loss": [1.0], "grad": [0.5, -2.1]}
    verdict = check.judge({"a": good, "b": dict(good), "c": bad}, "float64")
    assert verdict["a"] is None and verdict["b"] is None and "grad[1]" in verdict["c"]


@pytest.mark.parametrize("values", [{"v": [np.nan]}, {"v": [1.0, 2.0]}, {"w": [1.0]}, {"v": [1.01]}])
def test_disagreement_names_nan_shape_keys_and_values(values):
    assert check.disagreement(values, {"v": [1.0]}, 1e-6)


def test_float32_tolerance_scales_with_the_largest_entry():
    assert check.disagreement({"g": [1000.0, 1e-3]}, {"g": [1000.0, 0.0]}, 2e-3) is None
    assert check.disagreement({"g": [1000.0, 5.0]}, {"g": [1000.0, 0.0]}, 2e-3)


def test_units():
    assert report.seconds(2.5e-6) == "2.5 us" and report.seconds(1.5) == "1.5 s"
    assert report.size(3 << 20) == "3 MB" and report.size(None) == "-"


def test_summary_names_the_fastest_peer_and_burjits_failures():
    rows = [{"workload": "a", "dtype": "float64", "framework": f, "status": "ok", "step_s": s}
            for f, s in [("burjit", 1e-6), ("burjit-ref", 1e-7), ("torch", 5e-6), ("jax", 2e-6)]]
    rows.append({"workload": "b", "dtype": "float64", "framework": "burjit", "status": "timeout", "note": "60 s"})
    run.add_ratios(rows)
    first, second = report.summary(rows)
    assert "fastest peer jax 2 us: 2x" in first and "burjit-ref" not in first
    assert "burjit timeout (60 s)" in second


def test_every_default_framework_has_an_adapter():
    for name in frameworks.DEFAULT:
        fw = frameworks.FRAMEWORKS[name]
        assert fw.name == name and fw.dtypes and all(callable(getattr(fw, m)) for m in ("load", "grad", "sgd"))


def test_the_adapters_import_no_framework_until_loaded():
    """A worker imports only its own framework: tflite's row must not carry TensorFlow's memory."""
    heavy = ("torch", "jax", "tensorflow", "ai_edge_litert", "mlx", "tinygrad", "autograd", "micrograd")
    code = f"import sys, benchmarks.frameworks; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_leaves_and_unflatten_round_trip_a_pytree():
    tree = {"b": [1, (2, 3)], "a": 4}
    assert unflatten(tree, [10 * x for x in leaves(tree)]) == {"b": [10, (20, 30)], "a": 40}


def test_front_door_prints_and_writes_every_case(tmp_path, capsys):
    from benchmarks import front_door
    out = tmp_path / "door.json"
    front_door.main(["--seconds", "0.002", "--rounds", "1", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["case"] for r in rows] == list(front_door.cases())
    assert all(r["compiled_us"] > 0 and r["plain_us"] > 0 for r in rows)
    printed = capsys.readouterr().out
    assert all(r["case"] in printed for r in rows)


def test_first_steps_times_three_batch_sizes_and_the_example_up_to_its_first_step(tmp_path, capsys):
    from benchmarks import first_steps
    out = tmp_path / "first.json"
    first_steps.main(["--rounds", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    assert [sorted(r) for r in result["runs"]["batches"]] == [["1", "16", "64"]]
    assert len(result["runs"]["gpt_char"]) == 1 and len(result["medians"]) == 4
    assert all(s > 0 for s in result["medians"].values())
    assert "gpt_char.py" in capsys.readouterr().out


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this machine")
def test_exported_rows_run_exp1_from_c_and_from_load_with_its_published_answer(tmp_path, capsys):
    from benchmarks import exported
    out = tmp_path / "exported.json"
    rows = exported.main(["--steps", "1000", "--calls", "100", "--rounds", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == rows and len(rows) == 3
    assert all(r["check"] == [612.5, -35.0, 1050.0] and r["us_per_step"] > 0 and r["peak_rss"] > 0 for r in rows)
    assert [r["heavy_imports"] for r in rows] == ["-", "-", "llvmlite,networkx"]
    assert "WRONG" not in capsys.readouterr().out


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this machine")
def test_the_burjit_load_row_runs_the_exported_tiny_step_in_a_worker_without_the_compiler(tmp_path):
    rows = run.main(["--quick", "--only", "tiny", "--frameworks", "burjit.load", "--rounds", "1",
                     "--round-time", "0.001", "--out", str(tmp_path)])
    assert [(r["framework"], r["status"]) for r in rows] == [("burjit.load", "ok")], rows
    assert rows[0]["step_s"] > 0 and rows[0]["peak_rss"] > 0
