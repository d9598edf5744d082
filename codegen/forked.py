"""Compile jobs in forked compile servers, so LLVM's memory stays out of the training process.

LLVM's compile-time memory (tens to hundreds of MB for a GPT step, and ~100 KB per module that
the O3 pass pipeline never gives back) lives in the servers instead of the caller, and a crash
inside LLVM becomes an exception here instead of the end of the process. A server is this
process forked (a few ms, no interpreter start), so it already holds llvmlite, the target
machine and every job function; it then answers jobs over a pipe at in-process speed. A `Batch`
keeps up to workers() servers busy at once (one per core), so independent kernels compile in
parallel; each job's result depends on its arguments alone, so the output is the same in any
order. A server retires after a job that left it holding more than RETIRE_BYTES of its own
memory, or after RETIRE_JOBS jobs (what LLVM keeps is then given back), and the next job forks
a fresh one. A fork of this process (e.g. by multiprocessing) gets servers of its own.

Used on Linux only (fork without exec is unsafe on macOS) and not with BURJIT_COMPILE_IN_PROCESS=1.
A fork copies no other thread, only the locks they hold; engine.py holds LOCK while it parses,
optimises, emits or loads code and the fork happens under LOCK, so no thread is inside LLVM then.
BURJIT_COMPILE_WORKERS sets how many servers work at once (default: the CPUs this process may use).
"""

import collections
import os
import pickle
import select
import signal
import struct
import sys
import threading
import time
import traceback

LOCK = threading.RLock()
RETIRE_BYTES = 256 << 20
RETIRE_JOBS = 500
_HEAD = struct.Struct("<BBQ")  # status (0 ok, 1 error), retiring, payload length

_servers = []  # idle servers, each (owner pid, server pid, request fd, reply fd)


def available():
    return sys.platform.startswith("linux") and os.environ.get("BURJIT_COMPILE_IN_PROCESS") != "1"


def workers():
    n = os.environ.get("BURJIT_COMPILE_WORKERS")
    return max(1, int(n)) if n else len(os.sched_getaffinity(0))


def run(job, *args):
    """job(*args) -> bytes, computed by a compile server; its exception or crash raises RuntimeError."""
    return run_all(job, [args])[0][0]


def run_all(job, arglists):
    """[(job(*args), seconds) for args in arglists], the jobs spread over up to workers() servers."""
    with Batch(job) as batch:
        for args in arglists:
            batch.submit(*args)
        return batch.results()


class Batch:
    """Calls of one job function handed to the compile servers as they come: `submit` sends each
    to an idle server (forking one while fewer than workers() work) and returns at once, so the
    caller goes on (emitting the next kernel's IR) while they compile; `results` waits for all.

    A context manager that holds LOCK throughout. Leaving it with answers still owed (an
    exception meanwhile, e.g. Ctrl-C) kills the servers that owe them: their pipes are out of step.
    """

    def __init__(self, job):
        self.job, self.args, self.answers = job, [], []
        self.todo, self.busy, self.failure = collections.deque(), {}, None  # busy: reply fd -> (server, i, start)

    def __enter__(self):
        LOCK.acquire()
        _forget_inherited()
        return self

    def __exit__(self, *exc):
        try:
            for server, _, _ in self.busy.values():
                os.kill(server[1], signal.SIGKILL)  # its answer would never be read
                _stop(server, reap=True)
            self.busy.clear()
        finally:
            LOCK.release()

    def submit(self, *args, first=False):
        """Queue job(*args) behind the jobs still queued, or ahead of them if `first`: for a job
        submitted last that the caller waits for with the rest, which behind them would compile
        alone at the end."""
        (self.todo.appendleft if first else self.todo.append)(len(self.args))
        self.args.append(args)
        self.answers.append(None)
        self._pump(wait=False)

    def results(self):
        """[(job(*args), seconds)] in submission order; seconds is each job's wall time, pipe included.

        The first job that failed (an exception or a crash in its server) raises RuntimeError,
        once every job has answered."""
        while self.todo or self.busy:
            self._pump(wait=True)
        if self.failure is not None:
            raise RuntimeError(self.failure)
        return self.answers

    def _pump(self, wait):
        """Send queued jobs to free servers, then read the answers that are ready (waiting for one if asked)."""
        while self.todo and len(self.busy) < workers():
            server = _servers.pop() if _servers else _start(self.busy)
            i = self.todo.popleft()
            request = pickle.dumps((self.job, self.args[i]))
            self.busy[server[3]] = (server, i, time.perf_counter())
            _write(server[2], struct.pack("<Q", len(request)) + request)
        if self.busy:
            for fd in select.select(list(self.busy), [], [], None if wait else 0)[0]:
                server, i, t0 = self.busy.pop(fd)
                ok, payload = _answer(server)
                self.answers[i] = (payload, time.perf_counter() - t0)
                if not ok and self.failure is None:
                    self.failure = payload


def _answer(server):
    """(ok, payload or error message) of the job `server` is working on; keeps it if it stays."""
    try:
        status, retiring, size = _HEAD.unpack(_read(server[3], _HEAD.size))
        payload = _read(server[3], size)
    except (OSError, EOFError):
        code = _stop(server, reap=True)
        why = f"of {signal.Signals(os.WTERMSIG(code)).name}" if os.WIFSIGNALED(code) else "unexpectedly"
        return False, f"the compiler process died {why}"
    if retiring:
        _stop(server, reap=True)
    else:
        _servers.append(server)
    if status:
        return False, "the compiler process failed:\n" + payload.decode(errors="replace")
    return True, payload


def _forget_inherited():
    """Servers inherited from the process we were forked from are its, not ours: close our copies."""
    for server in [s for s in _servers if s[0] != os.getpid()]:
        _servers.remove(server)
        _stop(server, reap=False)


def _start(busy):
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    pid = os.fork()  # under LOCK (run_all holds it)
    if pid == 0:
        code = 1
        try:
            for other in _servers + [s for s, _, _ in busy.values()]:
                os.close(other[2])  # another server's pipe ends: held here, it would never see EOF
                os.close(other[3])
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


def stop_all():
    """Stop every idle server of this process (they exit on the end of their pipes)."""
    with LOCK:
        _forget_inherited()
        while _servers:
            _stop(_servers.pop(), reap=True)


def _stop(server, reap):
    """Close the pipes to a server (it exits on their end); reap=True waits for it, giving its status."""
    _, pid, out, back = server
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
