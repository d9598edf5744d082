"""Export micrograd's moons MLP step (../micrograd_mlp.py) as a C library for main.c.

    python export.py build          # build/moons.{so,o,h,json} and build/moons_data.h
    python export.py build --python # also train here with the compiled step, printing as ./train does

moons_data.h holds the initial parameters and the data, so the C program starts where the
Python one does; every double is printed with 17 significant digits, which round-trips it
exactly, so the two programs' losses can be compared bit for bit.
"""

import argparse
import runpy
from pathlib import Path

import numpy as np

import burjit

MLP = runpy.run_path(str(Path(__file__).resolve().parent.parent / "micrograd_mlp.py"))
STEPS, SEED = 100, 1337


def setup():
    """(the compiled step, its first arguments but the learning rate), as micrograd_mlp.py makes them."""
    rng = np.random.default_rng(SEED)
    x, y = MLP["make_moons"](100, 0.1, rng)
    params = [layer.init(rng) for layer in MLP["LAYERS"]]
    return burjit.compile(MLP["train"], donate_argnums=0, tier="straight"), params, x, y


def learning_rate(k):
    return 1.0 - 0.9 * k / STEPS  # main.c computes it in the same order: the same bits


def line(k, loss, accuracy):
    return f"step {k} loss {loss:.17g} accuracy {accuracy:.17g}"


def data_header(params, x, y):
    """moons_data.h: the inputs' first values in the step's flattened order, the learning rate last."""
    leaves = burjit.pytree.flatten((params, x, y))[0]
    out = ["/* moons_data.h: written by export.py, the first values of moons_step's inputs. */",
           f"#define STEPS {STEPS}", f"#define N_PARAM_LEAVES {len(burjit.pytree.flatten(params)[0])}",
           f"#define LR_INPUT {len(leaves)}  /* the input after these: the learning rate */"]
    for k, a in enumerate(leaves):
        values = ", ".join(f"{v:.17g}" for v in np.asarray(a, np.float64).ravel())
        out.append(f"static double input_{k}[] = {{{values}}};")
    out.append("static double *const INPUTS[] = {" + ", ".join(f"input_{k}" for k in range(len(leaves))) + "};")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build", type=Path, help="directory to write the library and moons_data.h into")
    ap.add_argument("--python", action="store_true", help="then train with the compiled step, printing as ./train")
    args = ap.parse_args(argv)
    step, params, x, y = setup()
    burjit.export(step, params, x, y, np.float64(learning_rate(0)), path=args.build / "moons")
    (args.build / "moons_data.h").write_text(data_header(params, x, y))
    if args.python:
        for k in range(STEPS):
            params, (loss, accuracy) = step(params, x, y, np.float64(learning_rate(k)))
            print(line(k, float(loss), float(accuracy)))


if __name__ == "__main__":
    main()
