"""schedule: a deterministic topological order of the kernels that lowers the planned memory."""

import numpy as np
import pytest
from hypothesis import given

from burjit import ops as F
from burjit.passes import memplan, pipeline, schedule

from test_passes_programs import MODELS, model_graph, ops_lists, program, traced


def check_order(g):
    sched = g.meta["schedule"]
    assert sorted(sched) == sorted(tuple(grp) for grp in g.meta.get("groups") or schedule.unfused_groups(g))
    step = {n: t for t, grp in enumerate(sched) for n in grp}
    assert all(step[u] <= step[v] for u, v in g.nx.edges() if u in step)


@given(ops_lists)
def test_schedule_is_a_topological_order_of_the_kernels(ops):
    graph, _ = traced(*program(ops), donate=0)
    for names in (["schedule"], ["simplify", "fuse", "schedule"]):
        check_order(pipeline.run(graph, names))


@pytest.mark.parametrize("name", MODELS)
def test_schedule_is_deterministic_and_never_worse_than_program_order(name):
    fused = pipeline.run(model_graph(name)[0], ["simplify", "fuse"])
    first, again = schedule.schedule(fused), schedule.schedule(pipeline.run(model_graph(name)[0], ["simplify", "fuse"]))
    check_order(first)
    assert first.meta["schedule"] == again.meta["schedule"]
    assert memplan.reuse(first).arena_bytes <= memplan.reuse(schedule.topological(fused)).arena_bytes


def test_greedy_consumes_big_values_before_making_more():
    def f(x, ws):
        ys = [x @ w for w in ws]  # program order makes every product before reducing any
        return sum(F.sum(F.tanh(y)) for y in ys)
    rng = np.random.default_rng(0)
    graph, _ = traced(f, (rng.standard_normal((64, 64)), [rng.standard_normal((64, 64)) for _ in range(6)]))
    fused = pipeline.run(graph, ["simplify", "fuse"])
    plain, greedy = memplan.reuse(schedule.topological(fused)), memplan.reuse(schedule.schedule(fused))
    assert greedy.arena_bytes <= plain.arena_bytes / 2
