"""The shared results file: the headline ratios of every benchmark merged into
``benchmarks/results.json`` (or wherever ``results`` points), drawn as a PNG
beside it, and logged with it to MLflow."""
from __future__ import annotations

import functools
import json
import os
import statistics
import tempfile

from dist_dl.core.deprecation import renamed_parameters

__all__ = ["result_entry", "report_entries", "tf_engine_variants", "merge_results", "plot_results",
           "results_digest", "publish_results", "GOALS"]

# The PNG's text field that names the results it was drawn from (results_digest).
PLOT_DIGEST_KEY = "Description"

# Goals of the headline ratios (issues 4-16): what the PNG draws them against.
GOALS = {"overhead": 0.95, "scaling": 0.85, "scaling_vs_peer": 1.0, "input_headroom": 1.0,
         "ensemble_speedup": 1.7, "ensemble_vs_ceiling": 0.9, "reader_ratio": 0.8}


def _processor() -> str:
    """The processor's model name (Linux), "" where it cannot be read: machines
    of one size with other processors give other figures."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


@functools.lru_cache(maxsize=None)
def _machine() -> str:
    """Cores (and their model), memory, GPUs and the stack, in one line (read
    once per process: every results entry carries it)."""
    import platform

    parts = [f"{os.cpu_count()} cores" + (f" ({cpu})" if (cpu := _processor()) else "")]
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        parts.append(f"{pages / 2 ** 30:.0f} GiB")
    except (ValueError, OSError):
        pass
    from dist_dl.launch.core.device import visible_gpus

    gpus = visible_gpus()
    parts.append(f"{len(gpus)} GPU(s)" if gpus else "no GPU")
    parts.append(f"{platform.system()} {platform.machine()}, Python {platform.python_version()}")
    from importlib.metadata import PackageNotFoundError, version

    for name in ("tensorflow", "tensorflow-cpu", "horovod", "pyspark"):
        try:
            parts.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            continue
    return ", ".join(parts)


def _command() -> str:
    import shlex
    import sys

    argv = list(sys.argv)
    if argv and argv[0].endswith(".py"):
        return shlex.join(["python", os.path.relpath(argv[0]), *argv[1:]])
    return shlex.join([os.path.basename(argv[0]) if argv else "python", *argv[1:]])


def result_entry(rounds: list, *, command: str | None = None, goal: float | None = None,
                 **extra) -> dict:
    """One key of the results file: the median of ``rounds`` as ``value``,
    the rounds, the command, the date (UTC), the machine, the load average."""
    import time

    values = [float(v) for v in rounds]
    return {"value": statistics.median(values), "rounds": values,
            "command": command or _command(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": _machine(), "load_average": [round(v, 2) for v in os.getloadavg()],
            **({"goal": goal} if goal is not None else {}), **extra}


def tf_engine_variants(variants: dict) -> list[str]:
    """The variants that train on the tf.distribute engine (each is also
    compared with ``tf_peer`` and with ``dist``)."""
    return [name for name, changes in variants.items() if changes.get("engine") == "tensorflow"]


def report_entries(report: dict, command: str | None) -> dict:
    entries = {}
    for name in ("overhead", "scaling", "scaling_vs_peer", "input_headroom"):
        if name in report["ratios"]:
            entries[name] = result_entry(report["ratios"][name], command=command,
                                         goal=GOALS[name])
    # The tf.distribute engine against its plain recipe (goal as Horovod's
    # against its peer) and against the Horovod engine.
    for name in tf_engine_variants(report["variants"]):
        entries["scaling_vs_tf_peer"] = result_entry(
            report["ratios"][f"{name}_vs_tf_peer"], command=command,
            goal=GOALS["scaling_vs_peer"])
        entries["tf_engine_vs_horovod"] = result_entry(report["ratios"][f"{name}_vs_dist"],
                                                       command=command)
    if report.get("input"):
        entries["input_headroom"]["note"] = report["input"]["message"]
    for name, values in report["setups"].items():
        entries[f"images_per_second.{name}"] = result_entry(
            values["images_per_second"], command=command, devices=values["devices"])
    return entries


def merge_results(path: str, entries: dict, own_prefixes: tuple = ()) -> dict:
    """Merge ``entries`` into the JSON results file at ``path`` and return
    the whole file: keys of ``entries`` are replaced, keys starting with one
    of ``own_prefixes`` (this benchmark's, from an earlier run) are dropped,
    every other key is kept. Written to a temporary file and renamed over the
    old one, under an exclusive lock on the folder, so concurrent benchmarks
    neither tear the file nor lose each other's keys."""
    import fcntl

    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    lock = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        merged = {}
        if os.path.exists(path):
            with open(path) as f:
                try:
                    merged = json.load(f)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path} is not valid JSON ({exc}); fix or remove it, and "
                                     "rerun the benchmarks whose keys it held") from exc
        merged = {k: v for k, v in merged.items()
                  if not any(k.startswith(p) for p in own_prefixes)}
        merged.update(entries)
        fd, tmp = tempfile.mkstemp(prefix=".results-", suffix=".json", dir=folder)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(dict(sorted(merged.items())), f, indent=1)
                f.write("\n")
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
        return merged
    finally:
        os.close(lock)


def results_digest(results: dict) -> str:
    """SHA-256 of a results dict's canonical JSON: written into the PNG that
    draws it, so a test can tell a PNG drawn from other figures."""
    import hashlib

    text = json.dumps(results, sort_keys=True, separators=(",", ":"))
    return "dist_dl results sha256 " + hashlib.sha256(text.encode()).hexdigest()


def plot_results(results: dict, path: str) -> str:
    """Draw a results file as a PNG at ``path``: images/s per setup (median
    bar, the rounds as dots, min-max whiskers; per device where a setup has
    several) and every ratio that has a goal (median, the rounds' range, the
    goal as a red mark). Returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on clusters and CI
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    # The reader alone is not a training setup (and would dwarf them): it is
    # drawn as its ratio, input_headroom.
    rates = {k[len("images_per_second."):]: v for k, v in results.items()
             if k.startswith("images_per_second.") and not k.endswith(".reader_alone")}
    ratios = {k: v for k, v in results.items() if "goal" in v}
    panels = [p for p in (rates, ratios) if p]
    height = max(3.0, 0.45 * max((len(p) for p in panels), default=1) + 1.5)
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(6.5 * max(1, len(panels)), height),
                             squeeze=False)
    axes = list(axes[0])
    if rates:
        ax = axes.pop(0)
        names = list(rates)
        for y, name in enumerate(names):
            entry, rounds = rates[name], rates[name]["rounds"]
            ax.barh(y, entry["value"], color="#9db9d9")
            ax.plot([min(rounds), max(rounds)], [y, y], color="black", lw=1)
            ax.plot(rounds, [y] * len(rounds), "o", color="black", ms=3)
            devices = entry.get("devices", 1)
            ax.text(max(rounds), y, f"  {entry['value']:.1f}"
                    + (f" ({entry['value'] / devices:.1f}/device)" if devices > 1 else ""),
                    va="center", fontsize=8)
        ax.set_yticks(range(len(names)), names)
        ax.invert_yaxis()
        ax.set_xlabel("images/s (bar: median; dots: rounds)")
        ax.set_xlim(0, 1.35 * max(max(v["rounds"]) for v in rates.values()))
        ax.set_title("Training throughput per setup", fontsize=10)
    if ratios:
        ax = axes.pop(0)
        names = sorted(ratios)
        top, bottom = 0.0, float("inf")
        for y, name in enumerate(names):
            entry, rounds = ratios[name], ratios[name]["rounds"]
            met = entry["value"] >= entry["goal"]
            colour = "#2a7d2a" if met else "#c46a00"
            ax.plot([min(rounds), max(rounds)], [y, y], color=colour, lw=2, alpha=0.5)
            ax.plot([entry["value"]], [y], "D", color=colour)
            ax.plot([entry["goal"]], [y], "|", color="red", ms=16, mew=2)
            ax.text(max(max(rounds), entry["goal"]), y,
                    f"  {entry['value']:.2f} / goal {entry['goal']}", va="center", fontsize=8)
            top = max(top, max(rounds), entry["goal"])
            bottom = min(bottom, min(rounds), entry["goal"])
        ax.set_yticks(range(len(names)), names)
        ax.invert_yaxis()
        # Log scale: ratios near 1 stay readable beside a headroom of 10x.
        ax.set_xscale("log")
        ax.set_xlim(bottom / 1.3, top * 2.2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("ratio, log scale (diamond: median; line: rounds' range; red: goal)")
        ax.set_title("Ratios against their goals (green: met)", fontsize=10)
    dates = sorted(v["date"] for v in results.values() if "date" in v)
    machines = sorted({v.get("machine", "") for v in results.values()})
    fig.suptitle(f"dist_dl benchmarks, {dates[0][:16]} to {dates[-1][:16]} UTC" if dates
                 else "dist_dl benchmarks", fontsize=11)
    fig.text(0.01, 0.01, "; ".join(machines)[:160], fontsize=7, color="gray")
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    fig.savefig(path, dpi=110, metadata={PLOT_DIGEST_KEY: results_digest(results)})
    plt.close(fig)
    return path


@renamed_parameters({"experiment": "experiment_name"})
def publish_results(path: str, entries: dict, *, log: bool = False,
                    tracking_uri: str | None = None, experiment_name: str | None = None,
                    run_name: str = "benchmark", own_prefixes: tuple = ()) -> dict:
    """Merge ``entries`` into the results file ``path`` (`merge_results()`),
    redraw its PNG beside it (same name, ``.png``), and with ``log`` log both
    as artifacts of a new MLflow run (``entries``' values as its metrics).
    Returns ``{"results": path, "png": ..., "run_id": ... or None}``."""
    merged = merge_results(path, entries, own_prefixes)
    png = plot_results(merged, os.path.splitext(path)[0] + ".png")
    run_id = None
    if log:
        import mlflow

        from dist_dl.tracking.target import mlflow_target

        with mlflow_target(tracking_uri, experiment_name) as experiment_id, \
                mlflow.start_run(run_name=run_name, experiment_id=experiment_id,
                                 nested=mlflow.active_run() is not None) as run:
            commands = sorted({e["command"] for e in entries.values()})
            mlflow.set_tag("commands", " | ".join(commands)[:5000])
            mlflow.log_metrics({k: v["value"] for k, v in entries.items()})
            mlflow.log_artifact(path)
            mlflow.log_artifact(png)
            run_id = run.info.run_id
    return {"results": path, "png": png, "run_id": run_id}
