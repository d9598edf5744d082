"""The compile server (codegen/forked.py): same object code as compiling in process, failures
as exceptions, retirement, and a server per process."""

import multiprocessing
import os
import signal

import numpy as np
import pytest

import burjit
from burjit import ops as F
from burjit.codegen import engine, forked

pytestmark = pytest.mark.skipif(not forked.available(), reason="the compile server needs Linux (fork)")


def _ir():
    step = burjit.compile(burjit.grad(lambda x, w: F.sum(F.tanh(x @ w)), argnums=1))
    return step.lower(np.ones((4, 3)), np.ones((3, 2))).executable._emitted()


def _fails():
    raise ValueError("no such kernel")


def _dies():
    os.kill(os.getpid(), signal.SIGKILL)


def _server_pid():
    return forked._server[1] if forked._server else None


def _stop_server():
    with forked.LOCK:
        if forked._server:
            forked._stop(reap=True)


def test_server_compiles_the_same_object_code_as_this_process():
    ir = _ir()
    assert engine.compile_object(ir) == engine._optimised_object(ir)
    assert _server_pid() is not None and _server_pid() != os.getpid()


def test_a_failing_or_dying_job_raises_and_the_next_job_compiles():
    with pytest.raises(RuntimeError, match="ValueError: no such kernel"):
        forked.run(_fails)
    with pytest.raises(RuntimeError, match="died of SIGKILL"):
        forked.run(_dies)
    assert forked._server is None  # the dead one is reaped, the next job starts another
    ir = _ir()
    assert engine.compile_object(ir) == engine._optimised_object(ir)


def test_server_retires_after_its_job_limit(monkeypatch):
    monkeypatch.setattr(forked, "RETIRE_JOBS", 2)
    _stop_server()
    ir = _ir()
    forked.run(engine._optimised_object, ir)
    first = _server_pid()
    forked.run(engine._optimised_object, ir)
    assert forked._server is None  # retired with its second answer
    forked.run(engine._optimised_object, ir)
    assert _server_pid() not in (None, first)
    _stop_server()  # it was forked with the lowered limit


def _compile_in_child(queue, cache):
    os.environ["BURJIT_CACHE_DIR"] = cache  # empty: the step really compiles here
    step = burjit.compile(lambda x: F.exp(x) * 7.0)
    queue.put((step(np.zeros(3)).tolist(), forked._server[0] == os.getpid()))


def test_a_forked_process_gets_a_server_of_its_own(tmp_path):
    engine.compile_object(_ir())  # this process has a server before the fork
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    p = ctx.Process(target=_compile_in_child, args=(queue, str(tmp_path)))
    p.start()
    got = queue.get(timeout=60)
    p.join(60)
    assert got == ([7.0, 7.0, 7.0], True) and p.exitcode == 0
    assert forked._server[0] == os.getpid()  # ours is untouched and still answers
    engine.compile_object(_ir())


def test_in_process_compiles_start_no_server(monkeypatch, tmp_path):
    monkeypatch.setenv("BURJIT_COMPILE_IN_PROCESS", "1")
    monkeypatch.setenv("BURJIT_CACHE_DIR", str(tmp_path))
    _stop_server()
    assert burjit.compile(lambda x: x * 5.0)(np.ones(2)).tolist() == [5.0, 5.0]
    assert forked._server is None
