"""Compile jobs in a forked compile server, so LLVM's memory stays out of the training process.

LLVM's compile-time memory (tens to hundreds of MB for a GPT step, and ~100 KB per module that
the O3 pass pipeline never gives back) lives in the server instead of the caller, and a crash
inside LLVM becomes an exception here instead of the end of the process. The server is this
process forked once (a few ms, no interpreter start), so it already holds llvmlite, the target
machine and every job function; it then answers jobs over a pipe at in-process speed. It retires
after a job that left it holding more than RETIRE_BYTES of its own memory, or after RETIRE_JOBS jobs (what LLVM keeps
is then given back), and the next job forks a fresh one. A fork of this process (e.g. by
multiprocessing) gets a server of its own.

Used on Linux only (fork without exec is unsafe on macOS) and not with BURJIT_COMPILE_IN_PROCESS=1.
A fork copies no other thread, only the locks they hold; engine.py holds LOCK while it parses,
optimises, emits or loads code and the fork happens under LOCK, so no thread is inside LLVM then.
"""

import os
import pickle
import signal
import struct
import sys
import threading
import traceback

LOCK = threading.RLock()
RETIRE_BYTES = 256 << 20
RETIRE_JOBS = 500
_HEAD = struct.Struct("<BBQ")  # status (0 ok, 1 error), retiring, payload length

_server = None  # (owner pid, server pid, request fd, reply fd)


def available():
    return sys.platform.startswith("linux") and os.environ.get("BURJIT_COMPILE_IN_PROCESS") != "1"


def run(job, *args):
    """job(*args) -> bytes, computed by the compile server; its exception or crash raises RuntimeError."""
    global _server
    request = pickle.dumps((job, args))
    with LOCK:
        if _server is not None and _server[0] != os.getpid():
            _stop(reap=False)  # inherited from the process we were forked from: its server, not ours
        if _server is None:
            _server = _start()
        try:
            _write(_server[2], struct.pack("<Q", len(request)) + request)
            status, retiring, size = _HEAD.unpack(_read(_server[3], _HEAD.size))
            payload = _read(_server[3], size)
        except (OSError, EOFError):
            code = _stop(reap=True)
            why = f"of {signal.Signals(os.WTERMSIG(code)).name}" if os.WIFSIGNALED(code) else "unexpectedly"
            raise RuntimeError(f"the compiler process died {why}") from None
        except BaseException:  # e.g. Ctrl-C mid-reply: the pipe is out of step, so this server goes
            _stop(reap=False)
            raise
        if retiring:
            _stop(reap=True)
    if status:
        raise RuntimeError("the compiler process failed:\n" + payload.decode(errors="replace"))
    return payload


def _start():
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    pid = os.fork()  # under LOCK (run holds it)
    if pid == 0:
        code = 1
        try:
            os.close(req_w)
            os.close(rep_r)
            _serve(req_r, rep_w)
            code = 0
        finally:
            os._exit(code)  # never the parent's cleanup (atexit, buffered files, finalizers)
    os.close(req_r)
    os.close(rep_w)
    return os.getpid(), pid, req_w, rep_r


def _serve(requests, replies):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent, which then closes the pipe
    for jobs in range(1, RETIRE_JOBS + 1):
        try:
            (size,) = struct.unpack("<Q", _read(requests, 8))
        except EOFError:
            return  # the parent is gone or closed the pipe
        job, args = pickle.loads(_read(requests, size))
        try:
            status, payload = 0, job(*args)
        except BaseException:
            status, payload = 1, traceback.format_exc().encode()
        retiring = jobs == RETIRE_JOBS or _own_bytes() > RETIRE_BYTES
        _write(replies, _HEAD.pack(status, retiring, len(payload)) + payload)
        if retiring:
            return


def _stop(reap):
    """Close the pipes to the server (it exits on their end); reap=True waits for it, giving its status."""
    global _server
    _, pid, out, back = _server
    _server = None
    os.close(out)
    os.close(back)
    return os.waitpid(pid, 0)[1] if reap else None


def _own_bytes():
    """Memory only the server maps (Private_*): pages still shared with the parent are not its cost."""
    with open("/proc/self/smaps_rollup") as f:
        return sum(int(line.split()[1]) << 10 for line in f if line.startswith("Private_"))


def _write(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read(fd, n):
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
