"""A native step as a C library: name.o, name.so (linked with the system's `cc` and libm, which
the step may call for pow), name.h, name.json.

The library is the step function and its kernels, compiled again as position-independent code
for the host CPU; the Python entry (abi.py) stays out, so nothing in it needs Python. Its one
exported symbol is `<name>_step(void **argv)`, the step function's own calling convention
(lowering.py): the inputs' pointers, the outputs', then the arena. The caller owns the arena,
so one library serves many threads with one arena each. What the step needs from Python around
a call (scalar-region records and loop-body arenas held in numpy arrays, donated buffers
restored when a computed index fails) cannot be honoured by the library: export refuses it.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import llvmlite.binding as llvm

from burjit.passes.memplan import ALIGN  # the arena's alignment (native.py allocates it so too)

from . import engine
from .lowering import SYMBOL


def refusal(executable):
    """Why the step cannot be a library, or None."""
    low = executable.lowering
    if low.static_error:
        return f"the step always fails: {low.static_error}"
    if low.record_slots:
        return ("it runs scalar regions on the tape tier, whose records live in Python; export it from "
                "burjit.compile(..., tier='straight')")
    if low.collectives:
        return "it calls MPI (psum, pmean), whose communicator and handles live in Python"
    if low.loop_slots:
        return "it holds a loop (fori_loop, scan, while_loop), whose body's arena Python allocates"
    if low.backup:
        return ("an index it computes may fail after a donated input was written, and Python restores that "
                "input; a library could not keep its promise to change nothing on an error")
    return None


def write(executable, path, leaves):
    """Write path.o, path.so (where a C compiler is found), path.h and path.json; return
    {kind: Path}. leaves: {"inputs": [name], "outputs": [name], "in_tree", "out_tree", "version"}."""
    why = refusal(executable)
    if why is not None:
        raise ValueError(f"burjit.export: this step cannot be exported: {why}")
    path = Path(path)
    name = path.name
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"burjit.export: the library's name {name!r} must be a C identifier")
    path.parent.mkdir(parents=True, exist_ok=True)
    files = {"o": path.with_suffix(".o"), "h": path.with_suffix(".h"), "json": path.with_suffix(".json")}
    _atomic(files["o"], _object(executable, f"{name}_step"))
    desc = describe(executable, name, leaves)
    _atomic(files["h"], header(desc).encode())
    cc = shutil.which(os.environ.get("CC") or "cc")
    so, linked = path.with_suffix(".so"), None
    if cc is not None:
        tmp = so.with_name(f".{so.name}.{os.getpid()}")
        done = subprocess.run([cc, "-shared", "-o", str(tmp), str(files["o"]), "-lm"], capture_output=True, text=True)
        if done.returncode:
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"burjit.export: {cc} could not link {so.name}:\n{done.stderr.strip()}")
        linked = hashlib.sha256(tmp.read_bytes()).hexdigest()
        os.replace(tmp, so)
        files["so"] = so
    desc["library_sha256"] = linked  # burjit.load refuses a .so that is not this one
    _atomic(files["json"], (json.dumps(desc, indent=1) + "\n").encode())
    if cc is None:
        raise RuntimeError(f"burjit.export: no C compiler found (cc, or $CC) to link {name}.so; "
                           f"{files['o']} holds the step's object code, link it yourself")
    return files


def _object(executable, symbol):
    """Position-independent object code of the step function (renamed `symbol`) and its kernels,
    every other function internal so two libraries never clash."""
    mod = executable._module(optimized=True, entry=False)
    for fn in mod.functions:
        if fn.is_declaration:
            continue
        if fn.name == SYMBOL:
            fn.name = symbol
        else:
            fn.linkage = llvm.Linkage.internal
    return engine.emit_library_object(mod)


def describe(executable, name, leaves):
    """name.json's contents: the ABI in data."""
    g, low = executable.graph, executable.lowering
    aliases = g.aliases

    def leaf(n, label):
        return dict(name=label, shape=list(g[n]["shape"]), dtype=g[n]["dtype"])
    outputs = [dict(leaf(n, label), written_into_input=aliases.get(j))
               for j, (n, label) in enumerate(zip(g.outputs, leaves["outputs"]))]
    errors = []
    for code, (node, size, k) in enumerate(low.errors, 1):  # k: the input holding the indices, if one does
        a = g[node]
        errors.append(dict(code=code, op=a["op"], axis_size=size, src=a.get("src"), input=k))
    return dict(burjit=leaves["version"], name=name, symbol=f"{name}_step", arena_bytes=low.arena_bytes,
                arena_align=ALIGN, inputs=[leaf(n, label) for n, label in zip(g.inputs, leaves["inputs"])],
                outputs=outputs, in_tree=leaves["in_tree"], out_tree=leaves["out_tree"], errors=errors,
                target=dict(triple=llvm.get_process_triple(), cpu=llvm.get_host_cpu_name(),
                            features=engine.host_features()))


_CTYPE = {"float32": "float", "float64": "double", "int32": "int32_t", "int64": "int64_t", "bool": "uint8_t"}


def header(desc):
    """name.h: the C ABI, documented."""
    name, N = desc["name"], desc["name"].upper()
    n_in, n_out = len(desc["inputs"]), len(desc["outputs"])
    lines = [f"/* {name}.h: a training step compiled by burjit {desc['burjit']}, as a C library ({name}.so).",
             " *",
             f" * int32_t {name}_step(void **argv) runs the step once. argv holds {n_in + n_out + 1} pointers:",
             f" *   argv[0 .. {n_in - 1}]: the inputs, in the order below;" if n_in else " *   (no inputs)",
             f" *   argv[{n_in} .. {n_in + n_out - 1}]: the outputs, in the order below;",
             f" *   argv[{n_in + n_out}]: the arena, {N}_ARENA_BYTES bytes aligned to {N}_ARENA_ALIGN, zero-filled",
             " *     before its first call and owned by the caller: one arena per thread running the step.",
             " * Every array is dense, C order (row-major), of the dtype below; an output the step writes into",
             " * a donated input is marked so: its pointer is not used, its values land in that input.",
             " * It returns 0, or an error code > 0 (an index out of range, listed below) having changed",
             " * no input (the outputs' contents are then undefined).",
             f" * The code was built for {desc['target']['cpu']} ({desc['target']['triple']}); {name}.json lists",
             f" * the CPU features it needs. Link a program with {name}.so, or with {name}.o and -lm. */",
             f"#ifndef {N}_H", f"#define {N}_H", "", "#include <stdint.h>", "",
             f"#define {N}_N_INPUTS {n_in}", f"#define {N}_N_OUTPUTS {n_out}",
             f"#define {N}_ARENA_BYTES {desc['arena_bytes']}", f"#define {N}_ARENA_ALIGN {desc['arena_align']}", ""]
    for kind, items in (("INPUT", desc["inputs"]), ("OUTPUT", desc["outputs"])):
        for k, x in enumerate(items):
            size = 1
            for d in x["shape"]:
                size *= d
            into = x.get("written_into_input")
            note = f"; written into input {into}" if into is not None else ""
            lines.append(f"/* {kind.lower()} {k}: {x['name']}, {_CTYPE[x['dtype']]} {x['dtype']}{x['shape']}{note} */")
            lines.append(f"#define {N}_{kind}_{k}_SIZE {size}")
    lines.append("")
    for e in desc["errors"]:
        where = str(e["src"] or "?").replace("*/", "* /")
        lines.append(f"#define {N}_ERROR_{e['code']} {e['code']}  /* index out of range for an axis of size "
                     f"{e['axis_size']}: {e['op']} at {where} */")
    lines += ["", f"int32_t {name}_step(void **argv);", "", f"#endif /* {N}_H */", ""]
    return "\n".join(lines)


def _atomic(path, data):
    """Write data to path through a temporary file, so a failed export leaves no half file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
