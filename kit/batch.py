"""Run a profile: a YAML grid of notebook parameters, one papermill-executed notebook per point.

    python -m kit.batch PROFILE [--shard i/n] [--outputs DIR]

Finished runs (metrics.json status ok) are skipped, so a rerun retries only failed and missing
ones; a failed run is recorded and the batch goes on; a lock per run keeps two batches on the
same profile from running one config twice. At the end the collector writes
outputs/tables/<profile>.{md,csv,tex} and a summary line; the exit status is 1 if any run failed.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from kit import io as kio
from kit.config import ConfigError, RunConfig
from kit.tasks import GLUE_TASKS

REPO = Path(__file__).resolve().parents[1]
PROFILE_KEYS = {"description", "notebook", "grid", "task_overrides", "skip_missing_tasks"}


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads `1e-5` as a string; accept exponent floats without a dot."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?$|^[-+]?\.(?:inf|Inf|INF)$|^\.(?:nan|NaN|NAN)$"),
    list("-+0123456789."))


@dataclass
class Profile:
    name: str
    path: Path
    notebook: Path
    points: list[dict]                 # notebook parameters per run
    skip_missing_tasks: bool


def profile_path(name: str) -> Path:
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.exists():
        return path
    path = REPO / "params" / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in (REPO / "params").glob("*.yaml")))
        raise ConfigError(f"unknown profile {name!r}: choose one of {known} (files in params/)")
    return path


def load_profile(name: str, outputs_dir: str = "outputs") -> Profile:
    path = profile_path(name)
    try:
        spec = yaml.load(path.read_text(), Loader=_Loader) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    unknown = set(spec) - PROFILE_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}; "
                          f"allowed: {', '.join(sorted(PROFILE_KEYS))}")
    grids = spec.get("grid") or {}
    grids = grids if isinstance(grids, list) else [grids]   # a list of grids: their union
    points, seen = [], set()
    for grid in grids:
        axes = {k: v if isinstance(v, list) else [v] for k, v in grid.items()}
        for values in itertools.product(*axes.values()):
            point = dict(zip(axes, values))
            point.update((spec.get("task_overrides") or {}).get(point.get("task"), {}))
            point.update(profile=path.stem, outputs_dir=str(Path(outputs_dir).resolve()))
            try:
                run_id = RunConfig.from_dict(point).run_id   # validate every point up front
            except ConfigError as err:
                raise ConfigError(f"{path}: {err}") from None
            if run_id not in seen:           # grids of a list may overlap
                seen.add(run_id)
                points.append(point)
    notebook = REPO / "notebooks" / f"{spec.get('notebook', 'finetune')}.ipynb"
    if not notebook.exists():
        raise ConfigError(f"{path}: notebook {notebook.name} not found in notebooks/")
    return Profile(path.stem, path, notebook, points, bool(spec.get("skip_missing_tasks", False)))


def shard(points: list, spec: str | None) -> list:
    """`i/n` keeps points i, i+n, i+2n ... (0 <= i < n): shards of a grid, no coordinator."""
    if not spec:
        return points
    match = re.fullmatch(r"(\d+)/(\d+)", spec)
    if not match or not int(match[1]) < int(match[2]):
        raise ConfigError(f"--shard {spec!r}: expected i/n with 0 <= i < n, e.g. 0/4")
    return points[int(match[1])::int(match[2])]


def missing_task_files(cfg: RunConfig) -> str | None:
    """Why a local GLUE task cannot run (its folder or files are absent), else None."""
    from kit.data import glue_source
    task = GLUE_TASKS.get(next((n for n in GLUE_TASKS if n.lower() == cfg.task.lower()), ""))
    source = glue_source(cfg.glue_dir)
    if task is None or source == "hub":
        return None
    for split in ("train", *task.dev_splits):
        if not (source / task.name / f"{split}.tsv").exists():
            return f"{source / task.name / (split + '.tsv')} not found"
    return None


def execute(profile: Profile, point: dict) -> tuple[str, str]:
    """Run one grid point through papermill; returns (status, detail)."""
    import papermill as pm
    from kit.train import finished_metrics, run_dir_of
    cfg = RunConfig.from_dict(point)
    if finished_metrics(cfg) is not None:
        return "skipped", "finished earlier"
    if profile.skip_missing_tasks and (why := missing_task_files(cfg)):
        return "absent", why
    run_dir = run_dir_of(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        # the whole resolved config, not just the grid point: the notebook's own defaults (a
        # smoke configuration) must not leak into the run, or its run id would differ from ours
        parameters = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.to_dict().items()}
        pm.execute_notebook(str(profile.notebook), str(run_dir / "notebook.ipynb"),
                            parameters=parameters, kernel_name="python3", progress_bar=False,
                            cwd=str(REPO))
    except Exception as err:   # the notebook failed or its kernel died
        detail = _failure_reason(err)
        if detail.startswith("RunLocked"):      # fit() refused: another batch trains it
            return "skipped", "running in another batch"
        metrics_path = run_dir / "metrics.json"
        recorded = json.loads(metrics_path.read_text()) if metrics_path.exists() else {}
        if recorded.get("status") != "failed":   # fit() could not record it: the kernel died
            kio.write_json(metrics_path, {
                "run_id": cfg.run_id, "task": cfg.task, "model": cfg.model,
                "method": cfg.method, "seed": cfg.seed, "profile": cfg.profile,
                "status": "failed", "error": detail})
        return "failed", recorded.get("error") or detail
    return "ok", ""


def _failure_reason(err: Exception) -> str:
    ename, evalue = getattr(err, "ename", None), getattr(err, "evalue", None)
    text = f"{ename}: {evalue}" if ename else f"{type(err).__name__}: {err}"
    return text.strip().splitlines()[0] if text.strip() else type(err).__name__


def run_profile(name: str, shard_spec: str | None = None, outputs_dir: str = "outputs") -> int:
    import logging
    # papermill warns about parameters missing from the notebook's parameters cell; every
    # parameter was validated against RunConfig above, so those warnings are noise here
    logging.getLogger("papermill").setLevel(logging.ERROR)
    profile = load_profile(name, outputs_dir)
    points = shard(profile.points, shard_spec)
    counts = {"ok": 0, "skipped": 0, "failed": 0, "absent": 0}
    started = time.perf_counter()
    for i, point in enumerate(points, 1):
        label = " ".join(f"{k}={point[k]}" for k in ("task", "method", "seed", "model") if k in point)
        t0 = time.perf_counter()
        status, detail = execute(profile, point)
        counts[status] += 1
        note = f" ({detail})" if detail else ""
        print(f"[{i}/{len(points)}] {label}: {status}{note} {time.perf_counter() - t0:.0f}s",
              flush=True)
    collect(profile, outputs_dir)
    print(f"profile {profile.name}: {counts['ok']} ok, {counts['skipped']} skipped, "
          f"{counts['failed']} failed, {counts['absent']} absent (task files missing) "
          f"in {time.perf_counter() - started:.0f}s", flush=True)
    return 1 if counts["failed"] else 0


def collect(profile: Profile, outputs_dir: str) -> list[Path]:
    """Tables of every run of the profile that has a folder (this shard's and others')."""
    from kit import report
    from kit.train import run_dir_of
    run_dirs = [d for d in (run_dir_of(RunConfig.from_dict(p)) for p in profile.points)
                if (d / "config.json").exists()]
    if not run_dirs:
        return []
    runs = report.load_runs(run_dirs)
    varying = [k for k in dict.fromkeys(k for p in profile.points for k in p)
               if len({json.dumps(p.get(k), sort_keys=True) for p in profile.points}) > 1]
    return report.write_tables(report.profile_tables(runs, varying), profile.name,
                               Path(outputs_dir) / "tables")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kit.batch", description=__doc__.splitlines()[0])
    parser.add_argument("profile", help="a name in params/ (demo, smoke, glue-small ...) or a YAML path")
    parser.add_argument("--shard", help="i/n: run every n-th grid point starting at i")
    parser.add_argument("--outputs", default=os.environ.get("SSA_KIT_OUTPUTS", "outputs"))
    args = parser.parse_args(argv)
    try:
        return run_profile(args.profile, args.shard, args.outputs)
    except (ConfigError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
