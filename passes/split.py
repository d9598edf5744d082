"""Split a step at its collectives: stage graphs that run in order, the collectives between them.

Phase 1 of collectives in compiled steps (burjit/staged.py runs the result): each stage is an
ordinary graph a backend compiles on its own, and each collective runs on the host between
two stages. A collective's level is one more than the deepest level it depends on; stage k
holds the other nodes whose deepest collective ancestor has level k, so a step with one pmean
of its gradients becomes two stages (gradients; update) around one allreduce.

A stage's inputs are the values it reads from outside itself (the step's inputs, earlier
stages' values, collectives' results); its outputs are the values later stages, collectives or
the step's outputs read. All are named by their node ids in the original graph. Constants
(nodes without operands) are copied into each stage that reads them, so they stay constants
there (foldable, fusable) rather than become inputs.
"""

from dataclasses import dataclass

from burjit import primitives as P
from burjit.graph import Graph


@dataclass
class Stage:
    graph: Graph
    reads: list   # original node ids, one per graph input
    writes: list  # original node ids, one per graph output


@dataclass
class Collective:
    node: int     # the collective's original node id
    op: str
    attrs: dict
    operand: int  # original node id of its operand


def is_collective(op):
    return P.PRIMITIVES[op].kind == "collective"


def split(graph):
    """[Stage | Collective, ...] in run order; every collective sits between the stages it separates."""
    level, ops = {}, {}
    for n in graph.topo():
        a = graph[n]
        deepest = max((level[o] for o in graph.operands(n)), default=0)
        level[n] = deepest + 1 if is_collective(a["op"]) else deepest
        ops[n] = a["op"]
    top = max(level.values(), default=0)
    members = [[] for _ in range(top + 1)]
    direct = set(graph.outputs) | {graph.operands(n)[0] for n in ops if is_collective(ops[n])}
    for n in graph.topo():  # a constant (no operands) goes into each stage that reads it, unless returned or reduced
        if ops[n] != "input" and not is_collective(ops[n]) and (graph.operands(n) or n in direct):
            members[level[n]].append(n)
    wanted = set(graph.outputs)  # read by another stage, a collective or the step's result
    for n in graph.nx._node:
        if ops[n] != "input":
            wanted.update(o for o in graph.operands(n) if is_collective(ops[n]) or level[o] != level[n]
                          or is_collective(ops[o]))
    plan = []
    for k, nodes in enumerate(members):
        if k:
            plan += [Collective(n, ops[n], dict(graph[n]["attrs"]), graph.operands(n)[0])
                     for n in graph.topo() if is_collective(ops[n]) and level[n] == k]
        if nodes:
            plan.append(_stage(graph, nodes, wanted))
    return plan


def _stage(graph, nodes, wanted):
    g, new, reads = Graph(), {}, []
    g.meta = {k: v for k, v in graph.meta.items() if k == "tier"}
    inside = set(nodes)

    def value(o):
        if o in new:
            return new[o]
        a = graph[o]
        if a["op"] != "input" and not graph.operands(o):  # a constant: this stage's own copy
            new[o] = g.add(a["op"], [], a["shape"], a["dtype"], a["attrs"], a.get("src"))
        else:  # a value from outside the stage becomes one of its inputs
            new[o] = g.add("input", [], a["shape"], a["dtype"],
                           {"index": len(reads), "shape": a["shape"], "dtype": a["dtype"]}, a.get("src"))
            g.inputs.append(new[o])
            reads.append(o)
        return new[o]
    for n in nodes:
        a = graph[n]
        operands = [new[o] if o in inside else value(o) for o in graph.operands(n)]
        new[n] = g.add(a["op"], operands, a["shape"], a["dtype"], a["attrs"], a.get("src"))
    writes = [n for n in nodes if n in wanted]
    g.outputs = [new[n] for n in writes]
    return Stage(g, reads, writes)
