"""The memory plan is checked, not trusted: replay the schedule on tagged memory and fail when a
value is read after its bytes were given to another; ratios for the done-criteria models; and
the poisoned-arena run of the native backend against the reference."""

import os
from unittest import mock

import numpy as np
import pytest
from hypothesis import given

import burjit
from burjit import ops as F
from burjit.jit import BACKENDS
from burjit.passes import memplan, pipeline
from burjit.passes.schedule import SOURCES

from test_passes_programs import CONFIGS, MODELS, model_graph, ops_lists, program, traced

PLANS = {"plan": ["simplify", "fuse", "schedule", "memplan"], "naive": ["simplify", "fuse", "schedule"],
         "unfused": ["simplify", "memplan"]}


def simulate(graph):
    """Run the schedule on memory where every byte remembers which value it holds."""
    plan, sched = graph.meta["memory"], graph.meta["schedule"]
    loc = plan.location
    arena = np.full(plan.arena_bytes, -1, dtype=np.int64)
    held = {("input", k): n for k, n in enumerate(graph.inputs)}  # caller buffer -> the value it holds

    def home(n):
        kind, where = loc[n][:2]
        if kind == "view":
            assert loc[where][0] != "view", "a view of a view"
            return home(where)
        return (kind, where), n

    def holds(n):
        (kind, where), root = home(n)
        if kind == "arena":
            region = arena[where:where + graph.nbytes(root)]
            return bool((region == root).all()) or region.size == 0
        return held.get((kind, where)) == root

    for n, (kind, where, *_) in loc.items():
        if kind == "arena":
            assert where % memplan.ALIGN == 0 and where + graph.nbytes(n) <= plan.arena_bytes
    for grp in sched:
        members = set(grp)
        outside = {o for n in grp for o in graph.operands(n) if o not in members and graph[o]["op"] not in SOURCES[1:]}
        assert all(holds(o) for o in outside), f"group {grp} reads a clobbered value"
        written = sorted(home(n)[0][1:] + (graph.nbytes(n),) for n in grp
                         if n in loc and loc[n][0] == "arena" and graph.nbytes(n))
        assert all(a[0] + a[1] <= b[0] for a, b in zip(written, written[1:])), f"group {grp} writes overlap"
        overwritten = set()
        for n in grp:
            if n not in loc or loc[n][0] == "view":
                continue
            (kind, where), _ = home(n)
            if kind == "arena":
                arena[where:where + graph.nbytes(n)] = n
            else:
                if kind == "input":  # in place: the old value's readers here must be same-index elementwise
                    old = graph.inputs[where]
                    overwritten.add(old)
                    for u in graph.users(old):
                        assert u not in members or burjit.primitives.PRIMITIVES[graph[u]["op"]].kind == "elementwise"
                held[(kind, where)] = n
        assert all(holds(o) for o in outside - overwritten), f"group {grp} overwrote its own operand"
    for o in graph.outputs:
        assert graph[o]["op"] in SOURCES[1:] or holds(o), f"output {o} was clobbered before the end"


def _materialised_have_homes(graph):
    group_of = {n: i for i, g in enumerate(graph.meta["schedule"]) for n in g}
    for n, i in group_of.items():
        if n in graph.outputs or any(group_of.get(u) != i for u in graph.users(n)):
            assert n in graph.meta["memory"].location, f"value {n} leaves its kernel but has no home"


@given(ops_lists)
def test_plans_never_overlap_live_values(ops):
    graph, _ = traced(*program(ops), donate=0)
    for names, greedy_limit in [(names, memplan.GREEDY_LIMIT) for names in PLANS.values()] + [(PLANS["plan"], 0)]:
        with mock.patch.object(memplan, "GREEDY_LIMIT", greedy_limit):  # 0: the time-order replay
            passed = pipeline.prepare(pipeline.run(graph, names))
        simulate(passed)
        _materialised_have_homes(passed)
        r = passed.meta["memory"].report()
        assert r["lower_bound"] <= r["arena_bytes"] <= r["naive_bytes"]


def test_a_buffer_takes_the_tightest_gap_among_the_buffers_live_beside_it():
    spans = [(0, 9, 512, "a"), (0, 1, 256, "b"), (0, 9, 256, "c"), (0, 1, 128, "d"), (0, 9, 128, "e"),
             (5, 9, 128, "f")]  # from step 5 on, b's 256 bytes and d's 128 are free: f fits both
    plan = memplan.MemoryPlan()
    assert memplan._place(plan, spans) == 1280
    assert {n: off for n, (_, off) in plan.location.items()} == dict(a=0, b=512, c=768, d=1024, e=1152, f=1024)


def test_many_values_are_placed_in_time_order_near_the_bound():
    def loss(w):
        acc = w[0] * 0.0
        for i in range(len(w) - 1):
            acc = acc + burjit.ops.tanh(w[i] * w[i + 1])
        return acc * acc
    ws = [np.float64(0.01 * i) for i in range(300)]
    graph, _ = traced(lambda w: burjit.value_and_grad(loss)(w), (ws,))
    with mock.patch.object(memplan, "GREEDY_LIMIT", 100):
        passed = pipeline.run(graph, ["simplify", "schedule", "memplan"])  # unfused: thousands of values
    simulate(passed)
    r = passed.meta["memory"].report()
    assert r["arena_bytes"] <= 1.25 * r["lower_bound"]


def test_simulation_catches_a_bad_plan():
    graph = pipeline.run(model_graph("mlp")[0])
    loc = graph.meta["memory"].location
    arena = sorted((n for n in loc if loc[n][0] == "arena"), key=graph.nbytes)
    loc[arena[-2]] = loc[arena[-1]]  # two values the greedy kept apart now share bytes
    with pytest.raises(AssertionError):
        simulate(graph)


@pytest.mark.parametrize("name", MODELS)
def test_models_reuse_memory(name):
    graph = pipeline.run(model_graph(name)[0])
    simulate(graph)
    r = graph.meta["memory"].report()
    assert r["arena_bytes"] <= 1.25 * r["lower_bound"]
    assert r["arena_bytes"] <= 0.5 * r["naive_bytes"]
    naive = pipeline.prepare(pipeline.run(model_graph(name)[0], PLANS["naive"])).meta["memory"]
    assert r["arena_bytes"] < naive.arena_bytes


@pytest.mark.parametrize("name", MODELS)
def test_donated_parameters_update_in_place(name):
    graph = pipeline.run(model_graph(name)[0])
    loc = graph.meta["memory"].location
    in_place = [j for j, k in graph.aliases.items() if loc.get(graph.outputs[j]) == ("input", k)]
    assert len(in_place) == len(graph.aliases)


def _location(graph, n):
    return graph.meta["memory"].location.get(n)


def test_in_place_waits_for_readers_of_the_old_value():
    def step(p):
        return p * 2.0, p[::-1] + 1.0  # the reversed read of the old p is another kernel
    graph, _ = traced(step, (np.arange(4.0),), donate=0)
    program_order = pipeline.run(graph, ["simplify", "fuse", "memplan"])  # the write comes first
    simulate(program_order)
    assert _location(program_order, program_order.outputs[0])[0] == "arena"
    scheduled = pipeline.run(graph)  # the schedule runs the reversed read first
    simulate(scheduled)
    assert _location(scheduled, scheduled.outputs[0]) == ("input", 0)


def test_returned_old_value_blocks_in_place():
    graph, _ = traced(lambda p: (p + 1.0, burjit.ops.reshape(p, (2, 2))), (np.zeros(4),), donate=0)
    passed = pipeline.run(graph)
    simulate(passed)
    assert _location(passed, passed.outputs[0])[0] == "arena"


def test_reshape_is_a_view_of_its_operand():
    F = burjit.ops
    graph, _ = traced(lambda x: F.sum(F.reshape(F.reshape(F.exp(x), (4, 2)) * 2.0, (8,)), 0), (np.zeros(8),))
    passed = pipeline.run(graph, ["fuse", "schedule", "memplan"])
    op = {passed[n]["op"]: n for n in passed.nx.nodes}
    views = {n: _location(passed, n) for n in passed.nx.nodes if passed[n]["op"] == "reshape"}
    assert sorted(views.values()) == sorted([("view", op["exp"], 0), ("view", op["mul"], 0)])


def _native_matches_reference(step, args, donate, atol, passes=None):
    """Run step natively with a poisoned arena (NaN in every byte not yet written) and compare."""
    copy = burjit.pytree.tree_map(lambda a: np.array(a, copy=True), args)
    want = burjit.compile(step, backend="reference", donate_argnums=donate)(*copy)
    with mock.patch.dict(os.environ, {"BURJIT_POISON_ARENA": "1"}):
        got = burjit.compile(step, backend="native", donate_argnums=donate, passes=passes)(*args)
    for w, g in zip(burjit.pytree.flatten(want)[0], burjit.pytree.flatten(got)[0], strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=atol)


needs_native = pytest.mark.skipif("native" not in BACKENDS, reason="the native backend is not registered")


@needs_native
@pytest.mark.parametrize("name", MODELS)
def test_poisoned_arena_matches_reference(name):
    step, args = MODELS[name]()
    _native_matches_reference(step, args, (0, 1) if name == "gpt" else 0, 2e-5)


@needs_native
@given(ops_lists)
def test_poisoned_arena_matches_reference_on_random_programs(ops):
    for names in CONFIGS:
        _native_matches_reference(*program(ops), donate=0, atol=1e-9, passes=names)


def test_a_slice_of_one_contiguous_block_is_a_view_at_its_offset():
    x = np.arange(60.0).reshape(3, 4, 5)

    def f(x):
        return [F.exp(x[1]), F.exp(x[2, 1:3]), F.exp(x[:, 0]), F.exp(x[0, :, ::2]), F.exp(x[1:, 1:])]
    graph, inputs = traced(f, (x,))
    passed = pipeline.run(graph)
    loc = passed.meta["memory"].location
    views = {passed[n]["attrs"]["starts"]: loc.get(n) for n in passed.nx.nodes if passed[n]["op"] == "slice"}
    assert views[(1, 0, 0)] == ("view", passed.inputs[0], 20 * 8)
    assert views[(2, 1, 0)] == ("view", passed.inputs[0], 45 * 8)
    assert all(loc is None or loc[0] != "view" for s, loc in views.items() if s not in ((1, 0, 0), (2, 1, 0)))
    simulate(passed)
    got = burjit.compile(f)(x)
    for g, want in zip(got, [x[1], x[2, 1:3], x[:, 0], x[0, :, ::2], x[1:, 1:]]):
        np.testing.assert_allclose(g, np.exp(want), rtol=1e-14)


def test_donated_parameters_read_through_row_views_update_correctly():
    p = np.linspace(-1, 1, 12).reshape(2, 6)

    def step(p):
        g = burjit.grad(lambda p: F.sum(F.exp(p[0]) * F.tanh(p[1]) + p[1] * p[0]))(p)
        return p - 0.1 * g, F.sum(p[1])
    want = burjit.compile(step, backend="reference")(p.copy())
    got = burjit.compile(step, donate_argnums=0)(p.copy())
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=1e-13)
