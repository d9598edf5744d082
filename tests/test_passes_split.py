"""split and the staged executable (phase 1 collectives), in one process: the allreduce's
reference rule is replaced by "two ranks holding the same values" (x * 2), so no MPI runs
here; tests/mpi_program.py runs the real thing under $BURJIT_COLLECTIVES=host."""

import numpy as np
import pytest

import burjit
from burjit import distributed, staged
from burjit import ops as F
from burjit.passes.simplify import simplify
from burjit.passes.split import Collective, Stage, split
from burjit.tracer import bind, lift

from test_passes_programs import traced


@pytest.fixture
def two_ranks(monkeypatch):
    monkeypatch.setattr(distributed, "allreduce_array", lambda x, ranks: x * 2)
    monkeypatch.setenv("BURJIT_COLLECTIVES", "host")


def _psum(x):
    return bind("allreduce", [lift(x)], ranks=2)


def _step(p, x):
    g = _psum(F.tanh(p * x))       # level 1
    h = _psum(g * 3.0 + p)         # level 2: reads a level-1 value and an input
    return p - 0.1 * h, F.sum(g), x  # x: an input returned as it is


def test_stages_sit_between_collectives_in_dependency_order():
    graph = simplify(traced(_step, (np.ones(3), np.ones(3)))[0])  # as the front door does
    plan = split(graph)
    assert [type(p) for p in plan] == [Stage, Collective, Stage, Collective, Stage]
    first, _, middle, _, last = plan
    assert first.reads == graph.inputs and [graph[n]["op"] for n in first.writes] == ["tanh"]
    assert {graph[n]["op"] for n in middle.reads} == {"input", "allreduce"}  # p and the first psum
    assert [graph[plan[3].operand]["op"]] == ["add"] and last.writes  # p - 0.1 h; sum(g) went in stage 1


@pytest.mark.parametrize("backend", ["native", "reference"])
def test_a_staged_step_matches_the_whole_graph_and_donates_at_the_end(two_ranks, backend):
    p, x = np.linspace(-1, 1, 3), np.arange(3.0)
    graph, _ = traced(_step, (p, x))
    want = burjit.evaluate(graph, [p, x])
    step = burjit.compile(_step, backend=backend, donate_argnums=0)
    mine = p.copy()
    got = step(mine, x)
    assert isinstance(step.lower().executable, staged.Staged) and len(step.lower().executable.stages()) == 3
    assert got[0] is mine and got[2] is not x  # the donated buffer updated; the returned input a fresh array
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-15)


def test_host_collectives_refuse_a_loop_that_holds_one(two_ranks):
    step = burjit.compile(lambda v: burjit.fori_loop(0, 2, lambda i, c: _psum(c), v))
    with pytest.raises(burjit.TracingError, match="test_passes_split.py.*\n.*inside a loop needs the native"):
        step(np.ones(2))


def test_an_unknown_mode_is_refused(monkeypatch):
    monkeypatch.setenv("BURJIT_COLLECTIVES", "sideways")
    with pytest.raises(ValueError, match="native, host"):
        staged.mode()


def test_constants_are_copied_into_stages_unless_returned_or_reduced(two_ranks):
    def f(x):
        return _psum(np.full(2, 3.0)) * 2.0 + _psum(x), np.float64(7.0)
    graph = simplify(traced(f, (np.ones(2),))[0])
    stages = [p for p in split(graph) if isinstance(p, Stage)]
    assert all(graph[n]["op"] != "const" for s in stages[1:] for n in s.reads)  # 2.0 is stage 1's own
    got = burjit.compile(f)(np.ones(2))
    assert got[0].tolist() == [14.0, 14.0] and float(got[1]) == 7.0
