"""The run's results as a text table, JSON, a Markdown report and a log-scale plot."""

import json

COLUMNS = ("workload", "framework", "time/step", "x burjit", "loop/step", "loop compile", "overhead/call",
           "import", "cold compile", "warm compile", "peak RSS", "peak RSS +", "arena", "status")


def _num(v):
    """Three significant digits, never in e-notation (999.7 -> '1000')."""
    return f"{v:.3g}" if abs(v) < 999.5 else f"{v:.0f}"


def seconds(s):
    if s is None:
        return "-"
    for unit, f in (("s", 1), ("ms", 1e3), ("us", 1e6), ("ns", 1e9)):
        if s * f >= 1 or unit == "ns":
            return f"{_num(s * f)} {unit}"


def size(b):
    if b is None:
        return "-"
    for unit, f in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if abs(b) >= f:
            return f"{_num(b / f)} {unit}"
    return f"{b} B"


def cells(r):
    status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r.get('note', '')}"
    return (f"{r['workload']} [{r['dtype']}]", r["framework"], seconds(r.get("step_s")),
            _num(r["ratio"]) if r.get("ratio") else "-", seconds(r.get("loop_s")), seconds(r.get("loop_compile_s")),
            seconds(r.get("overhead_s")),
            seconds(r.get("import_s")), seconds(r.get("cold_compile_s")), seconds(r.get("warm_compile_s")),
            size(r.get("peak_rss")), size(r.get("peak_rss_delta")), size(r.get("arena_bytes")), status)


def header(meta):
    versions = ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
    tuning = (f"; OPENBLAS tuning {meta['openblas_tuning']} {'kept' if meta['openblas_tuning_kept'] else 'unset in workers'}"
              if meta["openblas_tuning"] else "")
    return [f"{meta['date']} on {meta['cpu']} ({meta['cores']} cores; every framework on 1 thread){tuning}",
            f"command: {meta['command']}  ({meta['wall_s']} s, burjit at {meta.get('revision')})",
            f"python {meta['python']}, numpy {meta['numpy']}; {versions}",
            f"median of {meta['rounds']} alternating rounds of ~{meta['round_time_s']} s each; "
            f"limit {meta['timeout_s']:g} s per request"]


def table(meta, rows):
    body = [COLUMNS] + [cells(r) for r in rows]
    widths = [max(len(str(row[i])) for row in body) for i in range(len(COLUMNS) - 1)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row[:-1], widths)) + "  " + row[-1] for row in body]
    return "\n".join(header(meta) + [""] + lines)


METHOD = """\
## How these numbers are made
- One command runs everything; each (workload, framework) runs in its own worker process,
  started with OMP/MKL/OPENBLAS threads = 1 before numpy is imported, `torch.set_num_threads(1)`,
  and `XLA_FLAGS=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1` before JAX is
  imported. OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (set on some machines for old OpenBLAS builds)
  are dropped in the workers unless `--keep-openblas-tuning`; tests and CI never touch them.
- Before anything is timed, every framework's value and gradient (for training steps: the loss
  and the gradient read back from the SGD update) must agree with the published numbers or with
  the majority of frameworks; one that does not is marked `wrong` and not timed.
- time/step: median over alternating rounds (every framework in turn, each round k back-to-back
  steps, k chosen so that a round takes about the round time) of what a training loop pays per
  step: the Python call of the compiled step with its argument flattening and result wrapping
  (JAX: until `block_until_ready`). x burjit: that time over burjit's, same run (> 1: burjit faster).
- loop/step: for a framework with a loop of its own, the same timing of k steps inside one call
  (JAX and burjit: `fori_loop` over the training step, or over value-and-gradient with each
  evaluation reading the last): the per-step cost once the Python call is out of the loop. `-`
  where the framework has no such loop. burjit's trip count is fixed at compile time, so each k
  is compiled (and run once) before it is timed; JAX's is an argument.
- loop compile: the first call of that loop with one iteration, in the process that already
  built the step (so caches of the step's own kernels may serve it): what adding the loop costs.
- overhead/call: the same timing of a compiled function that takes the step's own arguments and
  returns the step's result structure without arithmetic (training: the donated parameters
  unchanged plus one element; gradients: the input vector plus one element). time/step minus
  overhead/call is the time spent in the step's native code.
- import: seconds to import the framework in a fresh worker (numpy already imported), the faster
  of the two fresh processes below.
- cold compile: build + first step, minus one step, in a fresh process whose compilation caches
  are empty directories of its own (BURJIT_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR,
  JAX_COMPILATION_CACHE_DIR with JAX's persistent cache on for every compile). warm compile: the
  same in a second fresh process over the caches the first one filled (its values and gradients
  must match the first's). Eager frameworks compile nothing: `-`.
- peak RSS: the whole worker process's high-water RSS (VmHWM: Python, numpy, the framework's
  import, build, compile and steps). peak RSS +: the high-water RSS during build, compile and
  steps (VmHWM reset after the import) minus the RSS at that point (results.json also has
  end_rss_delta, after the last step). Both are read before the loop (loop/step) is built;
  results.json's loop_peak_rss is the high-water mark with the loops too. arena: burjit's planned workspace (`step.memory_plan()`).
- Each request to a worker has a time limit; past it the worker is killed and marked `timeout`,
  and that framework is not tried on the larger cases of the same workload.
"""


def summary(rows):
    """One line per case: burjit's time per step against the fastest peer's in the same run."""
    lines = []
    for case in dict.fromkeys((r["workload"], r["dtype"]) for r in rows):
        here = [r for r in rows if (r["workload"], r["dtype"]) == case]
        mine = next((r for r in here if r["framework"] == "burjit"), None)
        peers = [r for r in here if not r["framework"].startswith("burjit") and r.get("step_s")]
        best = min(peers, key=lambda r: r["step_s"]) if peers else None
        head = f"{case[0]} [{case[1]}]: "
        if mine is None or not mine.get("step_s"):
            why = f"{mine['status']} ({mine.get('note', '')})" if mine else "not run"
            lines.append(head + f"burjit {why}" + (f"; fastest peer {best['framework']} "
                                                     f"{seconds(best['step_s'])}" if best else ""))
        elif best:
            lines.append(head + f"burjit {seconds(mine['step_s'])} per step, fastest peer {best['framework']} "
                         f"{seconds(best['step_s'])}: {_num(best['ratio'])}x")
        else:
            lines.append(head + f"burjit {seconds(mine['step_s'])} per step, no peer timed")
    return lines


def markdown(meta, rows, picture=None):
    lines = ["# burjit benchmarks", ""] + [f"- {h}" for h in header(meta)] + ["", "## Workloads"]
    lines += [f"- **{name}**: {text}" + (f" Published reference: {meta['published'][name]}."
                                         if name in meta.get("published", {}) else "")
              for name, text in meta.get("workloads", {}).items()]
    lines += ["", "## Summary (ratio: the peer's time per step over burjit's; > 1 means burjit is faster)", ""]
    lines += [f"- {line}" for line in summary(rows)]
    lines += ["", "## Results", "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(c).replace("|", "/") for c in cells(r)) + " |" for r in rows]
    if picture:
        lines += ["", f"Time per step and whole-process peak RSS, log scale: `{picture}` beside this file.",
                  "", f"![time per step and peak memory]({picture})"]
    return "\n".join(lines + ["", METHOD])


def write_json(path, meta, rows):
    path.write_text(json.dumps({"meta": meta, "results": rows}, indent=1, default=str))


def plot(path, rows):
    """Time per step and whole-process peak RSS per workload, one bar per framework, log scale.
    Returns False (and writes nothing) when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False

    def case(r):  # the workload, its case and dtype on lines of their own: narrow tick labels
        return f"{r['workload']} [{r['dtype']}]".replace(" ", "\n")
    cases = list(dict.fromkeys(case(r) for r in rows))
    fws = list(dict.fromkeys(r["framework"] for r in rows))
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 1.6 * len(cases)), 8), sharex=True)
    width = 0.8 / max(len(fws), 1)
    panels = ((axes[0], "step_s", "time per step (s)"), (axes[1], "peak_rss", "peak RSS, whole process (bytes)"))
    for ax, key, ylabel in panels:
        for j, fw in enumerate(fws):
            xs, ys = [], []
            for i, c in enumerate(cases):
                v = next((r.get(key) for r in rows
                          if r["framework"] == fw and case(r) == c), None)
                if v and v > 0:
                    xs.append(i + (j - (len(fws) - 1) / 2) * width)
                    ys.append(v)
            ax.bar(xs, ys, width, label=fw)
        ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", which="major", alpha=0.3)
    axes[0].legend(ncol=min(len(fws), 7), fontsize="small", loc="lower center", bbox_to_anchor=(0.5, 1.0))
    axes[1].set_xticks(range(len(cases)))
    axes[1].set_xticklabels(cases, fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
