"""burjit.distributed under real MPI: 1, 2 and 3 ranks on localhost (tests/mpi_program.py).

The programs run under mpiexec in child processes (MPI in the pytest process would be shared
with the compile servers it forks). Without mpi4py or mpiexec these tests skip with the reason,
unless $BURJIT_REQUIRE_MPI=1 (as .ci/run sets after installing ".[mpi]"): then they fail.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from burjit import distributed

PROGRAM = Path(__file__).with_name("mpi_program.py")
EXAMPLE = Path(__file__).parent.parent / "examples" / "data_parallel.py"


def _mpiexec():
    missing = None
    if importlib.util.find_spec("mpi4py") is None:
        missing = "mpi4py is not installed (pip install -e \".[mpi]\")"
    found = distributed.launcher()
    if missing is None and found is None:
        missing = "no mpiexec on PATH (pip install -e \".[mpi]\" brings MPICH's)"
    if missing:
        if os.environ.get("BURJIT_REQUIRE_MPI") == "1":
            pytest.fail(f"$BURJIT_REQUIRE_MPI=1 but {missing}")
        pytest.skip(missing)
    return found


def _run(n, *args, timeout=240, program=PROGRAM, **env):
    env = dict(os.environ, MPIEXEC_TIMEOUT=str(timeout), **env)
    return subprocess.run([_mpiexec(), "-n", str(n), sys.executable, str(program), *args], env=env,
                          capture_output=True, text=True, timeout=timeout + 30)


@pytest.mark.parametrize("model", ["mlp", "gpt"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_data_parallel_training_equals_one_process_on_the_full_batch(ranks, model):
    done = _run(ranks, "train", model)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"OK train {model} micro=1 ranks={ranks}" in done.stdout


def test_gradient_accumulation_composes_with_pmean():
    # 2 micro-batches per shard, summed locally, one pmean per step: still the full batch's step
    done = _run(2, "train", "mlp", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "OK train mlp micro=2 ranks=2" in done.stdout


@pytest.mark.parametrize("what", [("train", "gpt"), ("train", "mlp", "2"), ("edges",)])
def test_host_collectives_between_compiled_stages_train_the_same(what):
    # phase 1: BURJIT_COLLECTIVES=host splits each step at its pmean (burjit/staged.py)
    done = _run(2, *what, BURJIT_COLLECTIVES="host")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"OK {what[0]}" in done.stdout and "ranks=2 collectives=host" in done.stdout


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_broadcast_shard_psum_pmean_edges(ranks):
    done = _run(ranks, "edges")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"OK edges ranks={ranks}" in done.stdout


def test_a_singleton_without_mpiexec_is_one_rank():
    _mpiexec()
    done = subprocess.run([sys.executable, str(PROGRAM), "train", "mlp"], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0 and "OK train mlp micro=1 ranks=1" in done.stdout, done.stderr[-3000:]


def test_a_rank_that_raises_aborts_the_job_with_its_message():
    done = _run(2, "fail", timeout=60)  # without the abort, rank 0 would wait in its allreduce until the timeout
    assert done.returncode != 0
    assert "ValueError: rank 1: a bad batch" in done.stderr and "MPI_Abort" in done.stdout + done.stderr


def test_an_index_refused_by_one_ranks_native_step_aborts_the_job():
    # rank 0 waits inside its native step's MPI_Allreduce; rank 1's step refuses a token
    done = _run(2, "fail", "index", timeout=60)
    assert done.returncode != 0
    assert "IndexError: index 99 is out of range" in done.stderr and "MPI_Abort" in done.stdout + done.stderr


def test_the_example_resumes_on_another_number_of_ranks(tmp_path):
    # 150 steps in one process == 100 steps on 2 ranks, then 50 more resumed on 3
    from burjit import nn
    one, many = tmp_path / "one.npz", tmp_path / "many.npz"
    runs = [(1, ["--steps", "150", "--checkpoint", str(one)]), (2, ["--steps", "100", "--checkpoint", str(many)]),
            (3, ["--steps", "50", "--resume", "--checkpoint", str(many)])]
    printed = []
    for n, args in runs:
        done = _run(n, *args, program=EXAMPLE)
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"({n} ranks)" in done.stdout
        printed.append(done.stdout)
    losses = [float(line.split()[3]) for line in printed[0].splitlines()]  # "step 1: loss 0.599 (1 ranks)"
    a, b = (nn._read(p) for p in (one, many))
    assert a[1] == b[1] == {"step": 150} and a[0].keys() == b[0].keys()
    assert max(float(np.max(np.abs(a[0][k] - b[0][k]))) for k in a[0]) <= 1e-12
    assert losses[-1] < 0.2 * losses[0]  # it learns: step 100's loss against step 1's


def test_the_throughput_benchmark_runs(tmp_path):
    _mpiexec()
    out = tmp_path / "d.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.distributed", "--seconds", "0.05", "--rounds", "1",
                           "--out", str(out)], cwd=Path(__file__).parent.parent, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert {(r["workload"], r["ranks"], r["collectives"]) for r in rows} == \
        {(w, k, c) for w in ("burtorch_gpt", "tensor_mlp") for k, c in ((1, "native"), (2, "native"), (2, "host"), (2, "none"))}
    assert all(r["samples_per_s"] > 0 and r["steps"] >= 8 for r in rows)
