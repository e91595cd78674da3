"""Which profiles have finished runs under an outputs folder, and when the newest of each
finished: what a notebook opened as it is shows (kit.results.views.notebook_defaults). A run
belongs to a profile by run id (`profile_run_dirs`, as the tables count it)."""
from __future__ import annotations

import os
from collections.abc import Sequence

from kit import runs
from kit.config.profiles import profile_path
from kit.config.run_config import ConfigError
from kit.results.frame.collect import profile_run_dirs


def finished_profiles(outputs_dir: str | os.PathLike = "outputs",
                      candidates: Sequence[str] = ()) -> dict[str, float]:
    """{profile in params/: the modification time of the newest finished run of its grid} for
    `candidates` and every profile a finished run's config.json names. Membership is by run id
    (`profile_run_dirs`, as the tables count): a grid whose points another profile finished
    first is found, though their config.json names that other profile. (Only those profiles:
    expanding every grid in params/ takes seconds.)"""
    return {name: max(times) for name, times in finished_runs(outputs_dir, candidates).items()}


def finished_runs(outputs_dir, candidates: Sequence[str]) -> dict[str, list[float]]:
    """{profile: the metrics.json times of its grid's finished runs} (see finished_profiles)."""
    root = runs.runs_root(outputs_dir)
    finished, named = {}, []                   # {run id: its metrics.json time}, read once
    for run_dir in runs.run_folders(root) if root.is_dir() else []:
        if (when := _finished_at(run_dir)) is None:
            continue
        finished[run_dir.name] = when
        try:
            named.append((runs.read_config(run_dir) or {}).get("profile"))
        except (OSError, ValueError):          # a corrupt file: collect_runs names it later
            continue
    found = {}
    for name in dict.fromkeys([*candidates, *sorted(filter(None, named))]):
        if _in_params(name):
            times = [finished[d.name] for d in profile_run_dirs(name, outputs_dir) or []
                     if d.name in finished]
            if times:
                found[name] = times
    return found


def _finished_at(run_dir) -> float | None:
    """metrics.json's modification time for a finished run; None for any other, or for one a
    rerun moves away while it is read."""
    try:
        if (runs.readable_metrics(run_dir) or {}).get("status") != "ok":
            return None
        return runs.metrics_path(run_dir).stat().st_mtime
    except OSError:
        return None


def _in_params(name: str) -> bool:
    try:
        return profile_path(name).parent.name == "params"
    except ConfigError:
        return False
