"""Fusion writes only the kernel forms codegen lowers, covers every compute node once, keeps the
kernel graph acyclic, and fuses what it should (softmax, forward with adjoint, scalar programs)."""

import networkx as nx
import numpy as np
import pytest
from hypothesis import given

import burjit
from burjit import ops as F
from burjit import primitives as P
from burjit.passes import fusion, pipeline
from burjit.passes.schedule import SOURCES

from test_passes_programs import MODELS, model_graph, ops_lists, program, traced


def _loop(g, n):
    return P.PRIMITIVES[g[n]["op"]].kind == "elementwise" or g[n]["op"] == "broadcast_to"


def check_groups(g):
    groups = g.meta["groups"]
    members = [n for grp in groups for n in grp]
    assert sorted(members) == sorted(n for n in g.nx.nodes if g[n]["op"] not in SOURCES)
    group_of = {n: i for i, grp in enumerate(groups) for n in grp}
    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(groups)))
    dag.add_edges_from((group_of[u], group_of[v]) for u, v in g.nx.edges() if u in group_of and group_of[u] != group_of[v])
    assert nx.is_directed_acyclic_graph(dag)
    assert all(group_of[u] <= group_of[v] for u, v in g.nx.edges() if u in group_of), "groups out of order"
    for grp in groups:
        inside = set(grp)
        assert all(grp.index(o) < grp.index(n) for n in grp for o in g.operands(n) if o in inside)
        reductions = [n for n in grp if g[n]["op"] in fusion.REDUCTIONS]
        if len(grp) == 1 and not _loop(g, grp[0]):
            continue  # (b), or (c) without prologue
        assert len(reductions) <= 1, f"two reductions in {grp}"
        shape = g[g.operands(reductions[0])[0]]["shape"] if reductions else g[grp[0]]["shape"]
        for n in grp:
            if n in reductions:
                continue
            assert _loop(g, n) and g[n]["shape"] == shape, f"{g[n]['op']} does not fit kernel {grp}"
            if g[n]["op"] == "broadcast_to":
                assert g.operands(n)[0] not in inside


@given(ops_lists)
def test_groups_are_lowerable_forms(ops):
    graph, _ = traced(*program(ops), donate=0)
    for names in (["fuse"], ["simplify", "fuse"]):
        check_groups(pipeline.run(graph, names))


@pytest.mark.parametrize("name", MODELS)
def test_models_fuse_into_far_fewer_kernels(name):
    simple = pipeline.run(model_graph(name)[0], ["simplify"])
    fused = fusion.fuse(simple)
    check_groups(fused)
    compute = sum(simple[n]["op"] not in SOURCES for n in simple.nx.nodes)
    assert len(fused.meta["groups"]) < 0.6 * compute


def _group_with(g, n):
    return next(grp for grp in g.meta["groups"] if n in grp)


def _ops(g, grp):
    return sorted(g[n]["op"] for n in grp)


def test_softmax_shift_exp_and_sum_share_a_kernel():
    graph, _ = traced(lambda x: F.softmax(x, -1), (np.zeros((4, 5)),))
    fused = pipeline.run(graph, ["simplify", "fuse"])
    exp = next(n for n in fused.nx.nodes if fused[n]["op"] == "exp")
    assert _ops(fused, _group_with(fused, exp)) == ["broadcast_to", "exp", "reduce_sum", "sub"]


def test_forward_and_adjoint_share_a_kernel():
    def f(x, c):
        return burjit.value_and_grad(lambda x: F.sum(F.exp(x) * c))(x)
    graph, _ = traced(f, (np.zeros(6), np.ones(6)))
    fused = pipeline.run(graph, ["simplify", "fuse"])
    exp = next(n for n in fused.nx.nodes if fused[n]["op"] == "exp")
    grp = _group_with(fused, exp)
    assert fused.outputs[1] in grp and "reduce_sum" in _ops(fused, grp)


def test_scalar_program_is_one_straight_line_kernel():
    """(Tier 'straight': in the others a scalar program this large is one region node, test_region.py.)"""
    def loss(w, x):
        acc = w[0] * 0.0
        for i in range(len(w) - 1):
            acc = acc + F.tanh(w[i] * x + w[i + 1]) * F.relu(w[i])
        return acc * acc
    ws = [np.float64(0.01 * i) for i in range(300)]
    graph = burjit.compile(lambda w, x: burjit.value_and_grad(loss)(w, x), backend="reference", passes=[],
                           tier="straight").graph(ws, np.float64(0.5))
    fused = pipeline.run(graph, ["simplify", "fuse"])
    assert len(fused.meta["groups"]) == 1 and len(fused.meta["groups"][0]) > 3000


def test_a_shared_broadcast_is_copied_into_each_kernel():
    def f(x, b):
        y = x + b  # b broadcast once, used by the forward add and by the adjoint of nothing else
        return F.sum(F.tanh(y) * b), F.max(y * b, 0)
    graph, _ = traced(f, (np.zeros((3, 4)), np.zeros(4)))
    fused = pipeline.run(graph, ["simplify", "fuse"])
    check_groups(fused)
    group_of = {n: i for i, grp in enumerate(fused.meta["groups"]) for n in grp}
    for n in fused.nx.nodes:
        if fused[n]["op"] == "broadcast_to":
            assert {group_of[u] for u in fused.users(n)} == {group_of[n]}


def test_cheap_values_are_recomputed_where_read_instead_of_stored(monkeypatch):
    graph = model_graph("gpt")[0]
    recomputing = pipeline.run(graph)
    monkeypatch.setattr(fusion, "CONE", 0)
    storing = pipeline.run(graph)
    check_groups(recomputing)
    assert not storing.meta["copies"] and all(o in graph.nx for o in recomputing.meta["copies"].values())
    assert recomputing.meta["memory"].arena_bytes < 0.85 * storing.meta["memory"].arena_bytes
