"""TFLite: the step converted by TensorFlow's TFLiteConverter, run by the ai-edge-litert interpreter.

TFLite is the lean peer: its row should weigh what its interpreter weighs. So the worker never
imports TensorFlow: a forked child (the workload's functions are in memory, nothing to pickle)
traces the step with TensorFlow, converts it and sends back the flatbuffers, then exits. The
child's time counts in "compile"; its memory goes to the log, not into the row's RSS.

TFLite's built-in kernels have no float64, and relu's gradient (ReluGrad) is a Flex op that the
interpreter cannot run, so relu is tf.maximum(x, 0) here. A converted step is a function, as
TFLite programs are: the new parameters it outputs are copied back into its inputs after each
invoke; the batch is set once, like the other frameworks' device-resident batches.
"""

import ctypes
import multiprocessing
import os
import re
import signal
import sys
import time
import traceback

import numpy as np

from ..measure import peak_bytes
from . import tf as tf_adapter
from .common import Bench, Skip, leaves, read_state, unflatten, version


def _die_with(parent):
    """The runner kills a worker that outlives its time limit: its converter must not linger on."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the worker died before prctl
        os._exit(1)


def _convert(build, send, parent):
    """In the child: build(tf, xp) -> tf.functions with input signatures; send their flatbuffers."""
    _die_with(parent)
    t = time.perf_counter()
    try:
        tf = tf_adapter.load()
        xp = tf_adapter.namespace(tf, relu=lambda x: tf.maximum(x, 0.0))
        out = [tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], f).convert()
               for f in build(tf, xp)]
    except Exception as e:  # whatever it is, the worker reports it
        traceback.print_exc()
        ops = sorted(set(re.findall(r"^\s*tf\.(\w+)\(", str(e), re.M)))
        return send.send(("skip", f"no TFLite built-in kernel for {', '.join(ops)}") if ops else
                         ("error", f"converting: {type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"))
    print(f"tflite: converted in {time.perf_counter() - t:.2f} s by a TensorFlow child process, peak RSS "
          f"{peak_bytes() / 2 ** 20:.0f} MB (not counted in the row)", file=sys.stderr, flush=True)
    send.send(("ok", out))


def converted(build):
    """The TFLite flatbuffers of the tf.functions that build(tf, xp) returns, made in a forked child."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_convert, args=(build, send, os.getpid()))
    child.start()
    send.close()
    try:
        kind, answer = receive.recv()
    except EOFError:
        child.join()
        raise RuntimeError(f"the TensorFlow converter process died (exit {child.exitcode})") from None
    child.join()
    if kind == "ok":
        return answer
    raise (Skip if kind == "skip" else RuntimeError)(answer)


class Program:
    """One converted function in its interpreter, on one thread: inputs by name, outputs by position."""

    def __init__(self, interpreter, flatbuffer):
        self.it = interpreter(model_content=flatbuffer, num_threads=1)
        self.it.allocate_tensors()
        self.inputs = {d["name"]: d["index"] for d in self.it.get_input_details()}
        self.outputs = [d["index"] for d in self.it.get_output_details()]

    def set(self, name, a):
        self.it.set_tensor(self.inputs[name], a)

    def get(self, name):
        return self.it.get_tensor(self.inputs[name])

    def output(self, i):
        return self.it.get_tensor(self.outputs[i])

    def invoke(self, copies=()):
        """Run, then copy output i into input `name` for each (name, i) in copies: one copy each."""
        self.it.invoke()
        for name, i in copies:
            if self.inputs[name] != self.outputs[i]:  # a trivial step returns its input tensor itself
                self.it.set_tensor(self.inputs[name], self.it.tensor(self.outputs[i])())


class TFLite:
    name = family = "tflite"
    dtypes = ("float32",)  # TFLite's built-in kernels have no float64

    def load(self, dtype):
        from ai_edge_litert.interpreter import Interpreter
        self.interpreter = Interpreter
        tf = next((v for v in map(version, ("tensorflow", "tensorflow-cpu")) if v != "?"), "?")
        return f"ai-edge-litert {version('ai-edge-litert')} (converted by tensorflow {tf})"

    def grad(self, f, x0):
        x0 = np.asarray(x0)

        def build(tf, xp):
            spec = [tf.TensorSpec(x0.shape, tf.as_dtype(x0.dtype), name="x")]
            return [tf.function(fn, input_signature=spec)
                    for fn in (tf_adapter.value_and_grad(tf, xp, f), tf_adapter.trivial_grad(tf))]
        step, trivial = (Program(self.interpreter, fb) for fb in converted(build))

        def call(program):
            program.set("x", x0)
            program.invoke()
        return Bench(lambda: call(step), lambda: {"value": step.output(0), "grad": step.output(1)},
                     lambda: call(trivial))

    def sgd(self, loss, params, batch, lr):
        p0, b0 = leaves(params), leaves(batch)
        names = [f"p{i}" for i in range(len(p0))] + [f"b{i}" for i in range(len(b0))]

        def build(tf, xp):
            spec = [tf.TensorSpec(a.shape, tf.as_dtype(a.dtype), name=n) for n, a in zip(names, p0 + b0)]

            def train(*args):
                p = args[:len(p0)]
                with tf.GradientTape() as tape:
                    tape.watch(p)
                    value = loss(xp, unflatten(params, p), unflatten(batch, args[len(p0):]))
                grads = tape.gradient(value, p)
                return (value, *(w - lr * tf.convert_to_tensor(g) for w, g in zip(p, grads)))
            return [tf.function(fn, input_signature=spec)
                    for fn in (train, lambda *args: (tf.reshape(args[0], [-1])[0], *args[:len(p0)]))]
        programs = [Program(self.interpreter, fb) for fb in converted(build)]
        for program in programs:
            for n, a in zip(names, p0 + b0):
                program.set(n, a)
        step, trivial = programs
        feedback = [(n, i + 1) for i, n in enumerate(names[:len(p0)])]

        def read():
            state = {"loss": step.output(0), "p": unflatten(params, [step.get(n) for n, _ in feedback])}
            return read_state(state, np.array)
        return Bench(lambda: step.invoke(feedback), read, lambda: trivial.invoke(feedback))
