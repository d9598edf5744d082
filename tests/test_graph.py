"""The graph IR's own readers and copy: they reach into networkx's dicts for speed, so check
them against networkx's public API on a graph with repeated operands and rewired edges."""

import networkx as nx
import numpy as np
import pytest

import burjit
from burjit import ops as F


def _graph():
    def f(x, y):
        a = x * x + y            # x twice: parallel edges
        b = F.exp(a) - a * y
        return F.sum(b * b), F.tanh(a)
    g = burjit.compile(f, passes=[]).graph(np.ones(3), np.ones(3))
    n = next(n for n in g.topo() if g[n]["op"] == "sub")
    g.set_operand(n, 1, g.inputs[0])  # rewired: keys stay operand positions
    return g


def _operands_by_networkx(g, n):
    return [u for u, _, k in sorted(g.nx.in_edges(n, keys=True), key=lambda e: e[2])]


def test_operands_and_topo_agree_with_networkx():
    g = _graph()
    for n in g.nx.nodes:
        assert g.operands(n) == _operands_by_networkx(g, n)
    assert g.topo() == list(nx.lexicographical_topological_sort(g.nx))


def test_copy_is_equal_and_independent():
    g = _graph()
    c = g.copy()
    assert nx.utils.graphs_equal(g.nx, c.nx) and sorted(g.nx.edges(keys=True)) == sorted(c.nx.edges(keys=True))
    assert c.fingerprint() == g.fingerprint()
    n = next(n for n in c.topo() if c[n]["op"] == "mul")
    c[n]["attrs"]["mark"] = 1
    c.set_operand(n, 0, c.inputs[1])
    c.nx.remove_node(c.outputs[1])
    assert "mark" not in g[n]["attrs"] and g.operands(n) != c.operands(n) and g.outputs[1] in g.nx
    for m in c.nx.nodes:  # both ends of an edge still see one edge-data dict
        for u, keys in c.nx._pred[m].items():
            assert c.nx._succ[u][m] is keys


def test_topo_refuses_a_cycle():
    g = _graph()
    first, last = g.topo()[1], g.topo()[-1]
    g.nx.add_edge(last, first, key=9)
    with pytest.raises(nx.NetworkXUnfeasible):
        g.topo()
