"""What the results and figure notebooks show when a person opens them and runs them as they are.

Their `profile = ""` means the runs that exist, by one rule (`pick_profile`, one printed line
saying which): the notebook's own profile (gamma and cost: gamma's; case_study: case-study's;
mechanism: mechanism's; PROFILE_NOTEBOOKS) when its grid has finished runs, else the main job's
(`./run_all.sh`, the demo profile), else the profile whose latest run finished last. A figure's
`task = ""` is its runs' one task, the synthetic one among several (`pick_figure_task`); the case
study's a task with checkpointed runs of both methods, SST-2 first (`pick_task`); a figure drawn
without some of its methods says so in one line (`present_methods`). With nothing to show,
`NoRuns` (kit.results.frame.no_runs): one line naming the command that makes the runs. Which
profiles have finished runs is kit.results.frame.discover's.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import pandas as pd

from kit import runs
from kit.config.paths import outputs_root
from kit.results.frame.collect import finished
from kit.results.frame.discover import finished_runs
from kit.results.frame.no_runs import MAIN, NoRuns, run_command

CASE_STUDY_TASKS = ("SST-2",)       # the paper's case study is on SST-2 reviews
# The notebooks written for one profile (its description names them): opened as they are, they
# show that profile's runs first; its report page shows them (kit.results.report.page).
PROFILE_NOTEBOOKS = {"gamma": ("gamma", "cost"), "case-study": ("case_study",),
                     "mechanism": ("mechanism",)}


def own_profile(notebook: str) -> str:
    """The profile a notebook is written for (PROFILE_NOTEBOOKS), else the main job's."""
    return next((name for name, notebooks in PROFILE_NOTEBOOKS.items() if notebook in notebooks),
                MAIN)


def pick_profile(outputs_dir: str | os.PathLike = "outputs", profile: str = "",
                 notebook: str = "") -> str:
    """`profile` when given; "" picks, of the profiles whose grid has finished runs, the
    notebook's own (`own_profile`: gamma's and cost's the gamma profile, case_study's
    case-study, mechanism's mechanism; the others' the demo), else the demo, else the one whose
    newest finished run is the newest (metrics.json's time), and prints one line saying which.
    No finished run of any: NoRuns naming the command that runs the notebook's own profile."""
    if profile:
        return profile
    own = own_profile(notebook)
    preferred = list(dict.fromkeys([own, MAIN]))
    found = finished_runs(outputs_dir, preferred)
    if not found:
        raise NoRuns(f"no finished runs of a profile under {runs.runs_root(outputs_dir)}: "
                     f"`{run_command(own)}` makes them, then run this notebook again")
    name = min(found, key=lambda name: (preferred.index(name) if name in preferred
                                        else len(preferred), -max(found[name])))
    if name == own != MAIN:
        why = f"the {own} profile's runs, this notebook's own"
    elif name == MAIN:
        why = "the main job's runs" + (f"; none of {own} yet" if own != MAIN else "")
    else:
        why = f"the newest finished runs; none of {' or '.join(preferred)} yet"
    print(f'profile = "{name}": {why} ({len(found[name])} finished under '
          f"{outputs_root(outputs_dir)}); set profile to show another", flush=True)
    return name


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


def pick_figure_task(frame: pd.DataFrame, task: str, default: str = "synthetic") -> str:
    """A figure's task (it shows one): `task` when given; "" picks the one task of the finished
    runs in `frame`, else `default` among several, else the first by name, and prints one line
    when it chose among several. No finished run: NoRuns."""
    if task:
        return task
    tasks = sorted(map(str, frame.loc[frame["status"] == "ok", "task"].dropna().unique())
                   ) if len(frame) else []
    if not tasks:
        raise NoRuns("no finished runs here to draw: choose another profile or model")
    chosen = default if default in tasks else tasks[0]
    if len(tasks) > 1:
        print(f'task = "{chosen}" (also: {", ".join(t for t in tasks if t != chosen)})',
              flush=True)
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
