"""The compile servers (codegen/forked.py): same object code as compiling in process, serially
or in parallel; failures as exceptions; retirement; servers per process."""

import multiprocessing
import os
import signal
import threading
import time

import numpy as np
import pytest

import burjit
from burjit import ops as F
from burjit.codegen import engine, forked

pytestmark = pytest.mark.skipif(not forked.available(), reason="the compile server needs Linux (fork)")


def _ir():
    step = burjit.compile(burjit.grad(lambda x, w: F.sum(F.tanh(x @ w)), argnums=1))
    return step.lower(np.ones((4, 3)), np.ones((3, 2))).executable._emitted()[0][0]  # the step function's module


def _fails():
    raise ValueError("no such kernel")


def _fails_on(fail):
    if fail:
        raise ValueError("no such kernel")
    return b"ok"


def _dies():
    os.kill(os.getpid(), signal.SIGKILL)


def _server_pids():
    return {s[1] for s in forked._servers}


def _stop_server():
    forked.stop_all()


def test_server_compiles_the_same_object_code_as_this_process():
    ir = _ir()
    assert engine.compile_object(ir) == engine._optimised_object(ir)
    assert _server_pids() and os.getpid() not in _server_pids()


def _kernel_texts():
    step = burjit.compile(burjit.value_and_grad(lambda x, w: F.sum(F.tanh(x @ w) * F.exp(w[0]))))
    exe = step.lower(np.ones((8, 6)), np.ones((6, 4))).executable  # above codegen's INLINE_ELEMENTS: kernels
    exe._emitted()  # the kernels' IR exists once the step's is emitted (not on a cache hit before)
    return list(exe.lowering.kernels.values())


def test_parallel_compiles_give_the_objects_of_serial_ones_in_order(monkeypatch):
    texts = _kernel_texts()
    assert len(texts) >= 3
    monkeypatch.setenv("BURJIT_COMPILE_WORKERS", "2")
    _stop_server()
    jobs = [(t, 2) for t in texts] * 2
    got = engine.compile_objects(jobs)
    assert len(_server_pids()) == 2  # both worked
    assert [obj for obj, _ in got] == [engine._optimised_object(*job) for job in jobs]
    assert all(seconds > 0 for _, seconds in got)


def _clock(_):
    return str(time.monotonic_ns()).encode()  # one clock for every process of the machine


def test_a_job_submitted_first_overtakes_the_queued_ones_and_answers_keep_submission_order(monkeypatch):
    monkeypatch.setenv("BURJIT_COMPILE_WORKERS", "1")
    with forked.Batch(_clock) as batch:
        for tag in "abc":  # a goes to the server at once, b and c wait
            batch.submit(tag)
        batch.submit("d", first=True)
        a, b, c, d = (int(obj) for obj, _ in batch.results())
    assert a < d < b < c


def test_a_failing_job_among_others_raises_and_the_servers_stay_usable(monkeypatch):
    monkeypatch.setenv("BURJIT_COMPILE_WORKERS", "2")
    ir = _ir()
    with pytest.raises(RuntimeError, match="ValueError: no such kernel"):
        forked.run_all(_fails_on, [(False,), (True,), (False,), (False,)])
    assert engine.compile_object(ir) == engine._optimised_object(ir)


def _sleeps(seconds):
    time.sleep(seconds)
    return b"slept"


def test_leaving_a_batch_with_answers_owed_stops_those_servers_and_frees_the_lock():
    _stop_server()
    with pytest.raises(KeyboardInterrupt):
        with forked.Batch(_sleeps) as batch:
            batch.submit(30)
            owing = _server_pids() | {s[1] for s, _, _ in batch.busy.values()}
            raise KeyboardInterrupt
    free = []
    t = threading.Thread(target=lambda: free.append(forked.LOCK.acquire(timeout=5) and forked.LOCK.release() is None))
    t.start()
    t.join()
    assert free == [True] and not _server_pids() & owing
    assert forked.run(_sleeps, 0) == b"slept"


def test_a_failing_or_dying_job_raises_and_the_next_job_compiles():
    _stop_server()
    with pytest.raises(RuntimeError, match="ValueError: no such kernel"):
        forked.run(_fails)
    with pytest.raises(RuntimeError, match="died of SIGKILL"):
        forked.run(_dies)
    assert not _server_pids()  # the dead one is reaped, the next job starts another
    ir = _ir()
    assert engine.compile_object(ir) == engine._optimised_object(ir)


def test_server_retires_after_its_job_limit(monkeypatch):
    monkeypatch.setattr(forked, "RETIRE_JOBS", 2)
    _stop_server()
    ir = _ir()
    forked.run(engine._optimised_object, ir)
    first = _server_pids()
    forked.run(engine._optimised_object, ir)
    assert not _server_pids()  # retired with its second answer
    forked.run(engine._optimised_object, ir)
    assert _server_pids() and not _server_pids() & first
    _stop_server()  # it was forked with the lowered limit


def _compile_in_child(queue, cache):
    os.environ["BURJIT_CACHE_DIR"] = cache  # empty: the step really compiles here
    step = burjit.compile(lambda x: F.exp(x) * 7.0)
    queue.put((step(np.zeros(3)).tolist(), {s[0] for s in forked._servers} == {os.getpid()}))


def test_a_forked_process_gets_a_server_of_its_own(tmp_path):
    engine.compile_object(_ir())  # this process has a server before the fork
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    p = ctx.Process(target=_compile_in_child, args=(queue, str(tmp_path)))
    p.start()
    got = queue.get(timeout=60)
    p.join(60)
    assert got == ([7.0, 7.0, 7.0], True) and p.exitcode == 0
    assert {s[0] for s in forked._servers} == {os.getpid()}  # ours are untouched and still answer
    engine.compile_object(_ir())


def test_in_process_compiles_start_no_server(monkeypatch, tmp_path):
    monkeypatch.setenv("BURJIT_COMPILE_IN_PROCESS", "1")
    monkeypatch.setenv("BURJIT_CACHE_DIR", str(tmp_path))
    _stop_server()
    assert burjit.compile(lambda x: x * 5.0)(np.ones(2)).tolist() == [5.0, 5.0]
    assert not forked._servers
