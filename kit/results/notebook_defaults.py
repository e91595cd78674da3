"""What the results and figure notebooks show when a person opens them and runs them as they are.

Their `profile = ""` means the runs that exist: the main job's (`./run_all.sh`, the demo
profile) when it has finished runs, else the profile whose latest run finished last
(`pick_profile`, one printed line saying which). The case study's `task = ""` is a task with
checkpointed runs of both methods, SST-2 first (`pick_task`); a figure drawn without some of its
methods says so in one line (`present_methods`). With nothing to show, `NoRuns`: one line naming
the command that makes the runs, no traceback, in a notebook too.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import pandas as pd

from kit import runs
from kit.config.paths import outputs_root
from kit.config.run_config import ConfigError
from kit.config.profiles import profile_path
from kit.results.collect import finished, profile_run_dirs

MAIN = "demo"                       # the profile `./run_all.sh` runs
CASE_STUDY_TASKS = ("SST-2",)       # the paper's case study is on SST-2 reviews


class NoRuns(ValueError):
    """Nothing to show, and the command that makes it, in one line. IPython shows an exception
    with `_render_traceback_` as the lines it returns: a notebook shows this line, not a
    traceback."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


def run_command(profile: str) -> str:
    return "./run_all.sh" if profile == MAIN else f"./run_all.sh {profile}"


def finished_profiles(outputs_dir: str | os.PathLike = "outputs") -> dict[str, float]:
    """{profile in params/: the modification time of its newest finished run's metrics.json},
    by each run's config.json `profile`."""
    root = runs.runs_root(outputs_dir)
    newest: dict[str, float] = {}
    for run_dir in runs.run_folders(root) if root.is_dir() else []:
        if (runs.readable_metrics(run_dir) or {}).get("status") != "ok":
            continue
        try:
            name = (runs.read_config(run_dir) or {}).get("profile")
        except (OSError, ValueError):          # a corrupt file: collect_runs names it later
            continue
        if not name:
            continue
        newest[name] = max(newest.get(name, 0.0), runs.metrics_path(run_dir).stat().st_mtime)
    return {name: when for name, when in newest.items() if _in_params(name)}


def _in_params(name: str) -> bool:
    try:
        return profile_path(name).parent.name == "params"
    except ConfigError:
        return False


def _finished_count(profile: str, outputs_dir) -> int:
    """The finished runs of the profile's current grid (its params/ file may have changed)."""
    dirs = profile_run_dirs(profile, outputs_dir) or []
    return sum((runs.readable_metrics(d) or {}).get("status") == "ok" for d in dirs)


def pick_profile(outputs_dir: str | os.PathLike = "outputs", profile: str = "",
                 prefer: str = MAIN) -> str:
    """`profile` when given; "" picks `prefer` when its grid has finished runs, else the profile
    whose newest finished run is the newest (metrics.json's time), and prints one line saying
    which. No finished run of any profile: NoRuns naming the command that runs `prefer`."""
    if profile:
        return profile
    newest = finished_profiles(outputs_dir)
    order = sorted(newest, key=lambda name: (name != prefer, -newest[name]))
    for name in order:
        count = _finished_count(name, outputs_dir)
        if count:
            why = ("the main job's runs" if name == MAIN == prefer else
                   f"the {prefer} profile's runs" if name == prefer else
                   f"the newest finished runs; none of {prefer} yet")
            print(f'profile = "{name}": {why} ({count} finished under {outputs_root(outputs_dir)})'
                  "; set profile to show another", flush=True)
            return name
    raise NoRuns(f"no finished runs of a profile under {runs.runs_root(outputs_dir)}: "
                 f"`{run_command(prefer)}` makes them, then run this notebook again")


def pick_task(frame: pd.DataFrame, task: str, method_names: Sequence[str],
              seed: int | None = None) -> str:
    """The case study's task: `task` when given; "" picks a task where every one of
    `method_names` has a finished run (of `seed`) that kept its best checkpoint, SST-2 first,
    and prints one line saying which. None has: NoRuns."""
    if task:
        return task
    ok = finished(frame, method_names, seed)
    kept = ok[[runs.best_checkpoint(d) is not None for d in ok["run_dir"]]] if len(ok) else ok
    tasks = [t for t, group in kept.groupby("task") if set(method_names) <= set(group["method"])]
    if not tasks:
        raise NoRuns(f"no task with checkpointed runs of {' and '.join(method_names)}"
                     + (f" (seed {seed})" if seed is not None else "")
                     + ": run a profile with save_checkpoints: true, e.g. `./run_all.sh`")
    chosen = sorted(tasks, key=lambda t: (t not in CASE_STUDY_TASKS, t))[0]
    print(f'task = "{chosen}": checkpointed runs of {" and ".join(method_names)}'
          + (f" (also: {', '.join(t for t in sorted(tasks) if t != chosen)})"
             if len(tasks) > 1 else ""), flush=True)
    return chosen


def present_methods(frame: pd.DataFrame, method_names: Sequence[str], what: str) -> list[str]:
    """The methods of `method_names` with finished runs in `frame`; one printed line names the
    others (a figure shows what exists). None at all: NoRuns."""
    have = set(finished(frame, method_names)["method"]) if len(frame) else set()
    shown = [m for m in method_names if m in have]
    missing = [m for m in method_names if m not in have]
    if not shown:
        raise NoRuns(f"{what}: no finished runs of {', '.join(method_names)} here; choose "
                     "other methods, task or profile")
    if missing:
        print(f"{what}: no finished runs of {', '.join(missing)} here; shown without them",
              flush=True)
    return shown
