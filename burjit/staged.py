"""A step whose collectives run on the host, between its compiled stages (phase 1).

The native step calls MPI_Allreduce itself (codegen/lowering.py). With $BURJIT_COLLECTIVES=host,
or under a backend that cannot, the front door splits the step at its collectives instead
(passes/split.py), compiles each stage like any step, and this executable runs them in order,
each collective through its primitive's reference rule: one packed buffer, one MPI call.
Stages donate nothing; donated inputs are written once every stage has run, so a failing
step changes nothing, as the contract for executables asks (burjit/jit.py).
"""

import numpy as np

from . import primitives as P
from .errors import TracingError
from .passes.split import Collective, is_collective, split
from .tracer import describe

MODES = ("native", "host")


def mode():
    """$BURJIT_COLLECTIVES: 'native' (the default: the step calls MPI) or 'host' (split here)."""
    import os
    m = os.environ.get("BURJIT_COLLECTIVES") or "native"
    if m not in MODES:
        raise ValueError(f"BURJIT_COLLECTIVES={m!r}; known: {', '.join(MODES)}")
    return m


def wanted(graph):
    """Whether this graph should be split: the host runs collectives and it holds one (not in a loop)."""
    if mode() != "host":
        return False
    for a in graph.nx._node.values():
        if a["op"] == "loop" and _holds_collective(a["attrs"]["body"].graph):
            raise TracingError(f"{describe(a.get('src'))}\n  psum/pmean inside a loop needs the native "
                               "collective: unset BURJIT_COLLECTIVES=host, or move it out of the loop")
    return any(is_collective(a["op"]) for a in graph.nx._node.values())


def _holds_collective(graph):
    return any(is_collective(a["op"]) or (a["op"] == "loop" and _holds_collective(a["attrs"]["body"].graph))
               for a in graph.nx._node.values())


class Staged:
    """Runs `build(stage graph)` executables in the order split() gives, collectives between."""

    def __init__(self, graph, build):
        self.graph = graph
        self.plan = [p if isinstance(p, Collective) else (p, build(p.graph)) for p in split(graph)]

    def __call__(self, inputs):
        g = self.graph
        env = dict(zip(g.inputs, inputs))
        for p in self.plan:
            if isinstance(p, Collective):
                env[p.node] = P.PRIMITIVES[p.op].ref(env[p.operand], **p.attrs)
                continue
            stage, run = p
            env.update(zip(stage.writes, run([env[n] for n in stage.reads])))
        outs = [env[o] for o in g.outputs]
        given = {id(x) for x in inputs}
        outs = [np.array(x) if id(x) in given else x for x in outs]  # fresh: a donated input is overwritten
        for o, i in g.aliases.items():
            np.copyto(inputs[i], outs[o])
            outs[o] = inputs[i]
        return outs

    def stages(self):
        """The stages' executables, in run order (their inspectors: llvm_ir(), stats(), ...)."""
        return [p[1] for p in self.plan if not isinstance(p, Collective)]
