"""The run's results as a text table, JSON, a Markdown report and a log-scale plot."""

import json

COLUMNS = ("workload", "framework", "time/step", "x burjit", "compile", "overhead/call", "peak RSS +",
           "arena", "status")


def seconds(s):
    if s is None:
        return "-"
    for unit, f in (("s", 1), ("ms", 1e3), ("us", 1e6), ("ns", 1e9)):
        if s * f >= 1 or unit == "ns":
            return f"{s * f:.3g} {unit}"


def size(b):
    if b is None:
        return "-"
    for unit, f in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if abs(b) >= f:
            return f"{b / f:.3g} {unit}"
    return f"{b} B"


def cells(r):
    status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r.get('note', '')}"
    return (f"{r['workload']} [{r['dtype']}]", r["framework"], seconds(r.get("step_s")),
            f"{r['ratio']:.3g}" if r.get("ratio") else "-", seconds(r.get("compile_s")),
            seconds(r.get("overhead_s")), size(r.get("peak_rss_delta")), size(r.get("arena_bytes")), status)


def header(meta):
    versions = ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
    tuning = (f"; OPENBLAS tuning {meta['openblas_tuning']} {'kept' if meta['openblas_tuning_kept'] else 'unset in workers'}"
              if meta["openblas_tuning"] else "")
    return [f"{meta['date']} on {meta['cpu']} ({meta['cores']} cores; every framework on 1 thread){tuning}",
            f"command: {meta['command']}  ({meta['wall_s']} s)",
            f"python {meta['python']}, numpy {meta['numpy']}; {versions}",
            f"median of {meta['rounds']} alternating rounds of ~{meta['round_time_s']} s each; "
            f"limit {meta['timeout_s']:g} s per request"]


def table(meta, rows):
    body = [COLUMNS] + [cells(r) for r in rows]
    widths = [max(len(str(row[i])) for row in body) for i in range(len(COLUMNS) - 1)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row[:-1], widths)) + "  " + row[-1] for row in body]
    return "\n".join(header(meta) + [""] + lines)


def markdown(meta, rows):
    lines = ["# burjit benchmarks", ""] + [f"- {h}" for h in header(meta)] + [
        "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(c).replace("|", "/") for c in cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_json(path, meta, rows):
    path.write_text(json.dumps({"meta": meta, "results": rows}, indent=1, default=str))


def plot(path, rows):
    """Time per step and peak RSS delta per workload, one bar per framework, log scale.
    Returns False (and writes nothing) when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    cases = list(dict.fromkeys(f"{r['workload']}\n[{r['dtype']}]" for r in rows))
    fws = list(dict.fromkeys(r["framework"] for r in rows))
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 1.6 * len(cases)), 8), sharex=True)
    width = 0.8 / max(len(fws), 1)
    for ax, key, ylabel in ((axes[0], "step_s", "time per step (s)"), (axes[1], "peak_rss_delta", "peak RSS delta (bytes)")):
        for j, fw in enumerate(fws):
            xs, ys = [], []
            for i, c in enumerate(cases):
                v = next((r.get(key) for r in rows
                          if r["framework"] == fw and f"{r['workload']}\n[{r['dtype']}]" == c), None)
                if v and v > 0:
                    xs.append(i + (j - (len(fws) - 1) / 2) * width)
                    ys.append(v)
            ax.bar(xs, ys, width, label=fw)
        ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", which="major", alpha=0.3)
    axes[0].legend(ncol=len(fws), fontsize="small", loc="upper left")
    axes[1].set_xticks(range(len(cases)))
    axes[1].set_xticklabels(cases, fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
