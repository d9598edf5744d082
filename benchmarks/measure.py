"""Timing, memory and environment helpers shared by the runner and its worker processes.

Two peak-memory figures: the whole process's high-water RSS (VmHWM: Python, numpy, the
framework's import and everything after), and the delta, the high-water RSS after the peak is
reset once the framework is imported minus the RSS at that moment, which counts what building,
compiling and running the workload cost. Linux resets VmHWM when "5" is written to
/proc/self/clear_refs; where that fails the delta is of ru_maxrss, so it includes the import.
"""

import os
import re
import resource
import subprocess
import time

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS")
XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
OPENBLAS_TUNING = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def worker_env(keep_openblas_tuning=False):
    """The environment of a worker: every math library on one thread, JAX on the CPU.

    OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE work around old OpenBLAS builds on some processors;
    current numpy does not need them, so a benchmark worker drops them unless told to keep them.
    """
    env = dict(os.environ)
    env.update({v: "1" for v in THREAD_VARS})
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + XLA_FLAGS).strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    if not keep_openblas_tuning:
        for v in OPENBLAS_TUNING:
            env.pop(v, None)
    return env


def _status_kib(field):
    m = re.search(rf"^{field}:\s+(\d+) kB", open("/proc/self/status").read(), re.M)
    return int(m.group(1)) if m else None


def rss_bytes():
    kib = _status_kib("VmRSS")
    return None if kib is None else kib * 1024


def reset_peak():
    """Restart the high-water RSS at the current RSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_bytes():
    kib = _status_kib("VmHWM")
    return (kib if kib is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def per_call(fn, k):
    """Seconds per call of fn() over k back-to-back calls."""
    t = time.perf_counter()
    for _ in range(k):
        fn()
    return (time.perf_counter() - t) / k


def cpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    m = re.search(r"^Model name:\s*(.+)$", out, re.M)
    return m.group(1).strip() if m else "unknown"


def git_revision(root):
    """HEAD's short hash, with '+changes' when the working tree differs from it (None outside git)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+changes" if dirty else "")) or None
