"""Run a profile: a YAML grid of notebook parameters, one papermill-executed notebook per point.

    python -m kit.batch PROFILE [--shard i/n] [--outputs DIR]

First a pre-flight, before any notebook kernel starts: the profile, every point's config and
every task's data files are checked, so a typo or a bad file stops the batch in seconds with
one line. Then the points run one after another in one warm kernel (kit.kernels: imports paid
once, namespace cleared between points, a fresh kernel after a failed point; --fresh-kernels
for one kernel per point); training progress is streamed to this terminal as plain lines.
Finished runs (metrics.json status ok) are skipped, so a rerun retries only failed and missing
ones; a failed run is recorded and the batch goes on; a lock per run keeps two batches on the
same profile from running one config twice. At the end the collector
writes outputs/tables/<profile>.{md,csv,tex}, prints the main table, draws the profile's
figures and prints a summary line; the exit status is 1 if any run failed.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from kit import io as kio
from kit import methods
from kit.train import progress as kprogress
from kit.train import tracking as ktracking
from kit.config.run_config import ConfigError, RunConfig
from kit.data.pipeline import glue_source, load_task_data
from kit.data.hub import hub_unreachable
from kit.models.backbones import ModelError, check_hub_model
from kit.kernels import Kernels
from kit.train.provenance import environment
from kit.methods.mlm import load_text
from kit.config.profiles import REPO, Profile, load_profile, profile_path, shard  # noqa: F401 (re-exported)
from kit.data.readers import DataError
from kit.runs import (config_path, finished_metrics, make_run_dir, read_metrics, record_failed,
                      run_dir_of)
from kit.config.tasks import GLUE_TASKS

# ---------------------------------------------------------------- pre-flight

@functools.cache
def _hub_reason() -> str | None:
    return hub_unreachable()


def missing_task_files(cfg: RunConfig) -> str | None:
    """Why a GLUE task cannot run (found nowhere: its files are absent, or it would come from
    an unreachable hub), else None. A glue_dir / GLUE_DIR that does not exist raises DataError."""
    task = GLUE_TASKS.get(cfg.task)          # RunConfig spells task names as the registry does
    if task is None:
        return None
    source = glue_source(cfg.glue_dir, task.name)
    if source == "hub":
        reason = _hub_reason()
        return (f"{task.name}: not in the project's data/glue, no glue_dir or GLUE_DIR set, and "
                f"the hub is unreachable ({reason})") if reason else None
    for split in ("train", *task.dev_splits, *(task.test_splits if cfg.reads_test else ())):
        if not (source / task.name / f"{split}.tsv").exists():
            return f"{source / task.name / (split + '.tsv')} not found"
    return None


def _data_key(cfg: RunConfig) -> tuple:
    """The fields that decide which files a point reads and how they are checked (not seeds,
    methods or knobs; pretraining checks that there is text)."""
    return (cfg.task, cfg.glue_dir, cfg.reads_test, cfg.n_folds, cfg.fold,
            methods.get(cfg.method).pretrain, cfg.pretrain_eval_text,
            *(getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name.startswith("csv_")))


def _single_task_configs(cfg: RunConfig) -> list[RunConfig]:
    """A multi-task point reads each of its tasks like a single-task run would."""
    if not cfg.tasks:
        return [cfg]
    return [dataclasses.replace(cfg, task=t, tasks=(), method="bert") for t in cfg.tasks]


def preflight(profile: Profile, points: list[dict]) -> dict[str, str]:
    """Check every point's data before any kernel starts; returns {run_id: why} for points to
    skip (their task is found nowhere and the profile says skip_missing_tasks). Raises one-line
    ConfigError / DataError for everything else: a task missing from a profile that needs it, a
    glue_dir that does not exist, a malformed file (with its line), a tracker not installed."""
    absent, checked = {}, {}
    for point in points:
        cfg = RunConfig.from_dict(point)
        ktracking.resolve(cfg.report_to)         # an explicit tracker that is not installed
        check_hub_model(cfg.model)               # offline and not cached: one line, now
        for one in _single_task_configs(cfg):
            key = _data_key(one)
            if key not in checked:
                checked[key] = missing_task_files(one)
                if checked[key] is None:         # parses the files: bad rows fail here, named
                    (load_text if methods.get(one.method).pretrain else load_task_data)(one)
            if checked[key] is not None:
                if not profile.skip_missing_tasks:
                    raise DataError(f"{profile.path}: {checked[key]}")
                absent[cfg.run_id] = checked[key]
    return absent


# ---------------------------------------------------------------- one point

def execute(profile: Profile, point: dict, processes: int = 1,
            kernels: Kernels | None = None) -> tuple[str, str]:
    """Run one grid point through papermill in `kernels` (None: a fresh kernel); returns
    (status, detail), status one of ok, skipped, failed. The executed notebook is written to a
    temp file and renamed into the run folder only by the batch that ran the point: a second
    batch never touches it. processes > 1: the point runs data-parallel under torchrun
    (`python -m kit.train.finetune`), with no notebook (a kernel is one process)."""
    cfg = RunConfig.from_dict(point)
    if finished_metrics(cfg) is not None:
        return "skipped", "finished earlier"
    run_dir = make_run_dir(cfg)
    with kio.FileLock(run_dir / ".batch.lock") as got:
        if not got:
            return "skipped", "running in another batch"
        if finished_metrics(cfg) is not None:               # it may have finished while we looked
            return "skipped", "finished earlier"
        if processes > 1:
            return _run_distributed(cfg, processes)
        try:
            with kio.atomic_path(run_dir / "notebook.ipynb") as tmp:
                status, detail = _run_notebook(kernels or Kernels(fresh=True), profile, cfg,
                                               tmp)
                if status == "skipped":     # the kernel found the run locked: not ours to write
                    raise _Discard
        except _Discard:
            pass
        return status, detail


class _Discard(Exception):
    """Leave the temp notebook unwritten (kio.atomic_path removes it)."""


def _run_notebook(kernels: Kernels, profile: Profile, cfg: RunConfig,
                  output: Path) -> tuple[str, str]:
    # the whole resolved config, not just the grid point: the notebook's own defaults (a smoke
    # configuration) must not leak into the run, or its run id would differ from ours
    parameters = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.to_dict().items()}
    try:
        kernels.execute(profile.notebook_for(cfg), output, parameters, stderr_file=sys.stderr)
    except Exception as err:   # the notebook failed or its kernel died
        detail = _failure_reason(err)
        if detail.startswith("RunLocked"):      # fit() refused: another process trains it
            return "skipped", "running in another process"
        return _failed(cfg, detail)
    return "ok", ""


def _failed(cfg: RunConfig, detail: str, processes: int = 1) -> tuple[str, str]:
    """The run's own failure record, or one for a process that died before writing it."""
    try:
        recorded = read_metrics(run_dir_of(cfg)) or {}
    except (OSError, ValueError):
        recorded = {}
    if recorded.get("status") != "failed":
        record_failed(cfg, detail, environment=environment(processes))
    return "failed", recorded.get("error") or detail


def _run_distributed(cfg: RunConfig, processes: int) -> tuple[str, str]:
    """One point on `processes` data-parallel processes: torchrun, one node (gloo on CPU, NCCL
    on GPUs). Their progress lines stream to this terminal; a crash is recorded as failed."""
    import subprocess
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg.to_dict(), f)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={processes}", "-m", "kit.train.finetune", f.name]
    # torchrun warns unless the threads per process are set: share the cores between them
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get(
        "OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // processes)))}
    errors, echo = [], True
    try:
        with subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) as proc:
            for line in proc.stderr:         # the ranks' progress lines, as they come
                if line.startswith("error: "):       # kit.train.finetune's one-line failure
                    errors.append(line.strip().removeprefix("error: "))
                    continue
                echo = echo and "Traceback" not in line and "ChildFailedError" not in line
                if echo:
                    sys.stderr.write(line)
    finally:
        os.unlink(f.name)
    if proc.returncode == 0:
        return "ok", ""
    detail = errors[0] if errors else f"torchrun exit {proc.returncode}"
    if detail.startswith("RunLocked"):
        return "skipped", "running in another process"
    return _failed(cfg, detail, processes)


def _failure_reason(err: Exception) -> str:
    ename, evalue = getattr(err, "ename", None), getattr(err, "evalue", None)
    text = f"{ename}: {evalue}" if ename else f"{type(err).__name__}: {err}"
    return text.strip().splitlines()[0] if text.strip() else type(err).__name__


# ---------------------------------------------------------------- the grid

def point_label(fields: Mapping) -> str:
    """`task=RTE method=ssa-h seed=0 model=minilm`: how a batch's lines name a point, from its
    config (RunConfig.to_dict(), or a run's config.json)."""
    return " ".join(f"{k}={fields[k]}" for k in ("task", "method", "seed", "model"))


def _eta(started: float, ran: int, left: int) -> str:
    if not ran or not left:
        return ""
    s = (time.perf_counter() - started) / ran * left
    return f", ETA {s // 60:.0f}m{s % 60:02.0f}s"


def prepare_kernels() -> None:
    """What every batch (and kit.run) sets before its first kernel, which inherits it."""
    import logging
    # papermill warns about parameters missing from the notebook's parameters cell; every
    # parameter was validated against RunConfig, so those warnings are noise here
    logging.getLogger("papermill").setLevel(logging.ERROR)
    os.environ[kprogress.ENV] = os.environ.get(kprogress.ENV) or "lines"   # progress as lines
    # OpenMP threads that wait sleep instead of spinning: spinning threads of one process steal
    # the cores of another on a shared machine (run_all.sh sets it too)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def run_profile(name: str, shard_spec: str | None = None, outputs_dir: str = "outputs",
                processes: int = 1, fresh_kernels: bool = False) -> int:
    prepare_kernels()
    profile = load_profile(name, outputs_dir)
    points = shard(profile.points, shard_spec)
    started = time.perf_counter()
    absent = preflight(profile, points)
    print(f"profile {profile.name}: {len(points)} runs, data checked in "
          f"{time.perf_counter() - started:.1f}s", flush=True)
    counts = {"ok": 0, "skipped": 0, "failed": 0, "absent": 0}
    started, ran = time.perf_counter(), 0
    with Kernels(fresh=fresh_kernels) as kernels:
        for i, point in enumerate(points, 1):
            cfg = RunConfig.from_dict(point)
            head = f"[{i}/{len(points)}] {point_label(cfg.to_dict())}"
            t0 = time.perf_counter()
            if cfg.run_id in absent:
                status, detail = "absent", absent[cfg.run_id]
            else:
                if finished_metrics(cfg) is None:
                    print(f"{head}: started", flush=True)
                status, detail = execute(profile, point, processes, kernels)
            counts[status] += 1
            ran += status in ("ok", "failed")
            note = f" ({detail})" if detail else ""
            print(f"{head}: {status}{note} {time.perf_counter() - t0:.0f}s"
                  f"{_eta(started, ran, len(points) - i)}", flush=True)
    collect(profile, outputs_dir, show=True)
    print(f"profile {profile.name}: {counts['ok']} ok, {counts['skipped']} skipped, "
          f"{counts['failed']} failed, {counts['absent']} absent (task files missing) "
          f"in {time.perf_counter() - started:.0f}s", flush=True)
    return 1 if counts["failed"] else 0


def collect(profile: Profile, outputs_dir: str, show: bool = False) -> list[Path]:
    """Tables of every run of the profile that has a folder (this shard's and others'), and the
    profile's figures; `show` prints the first table to the terminal."""
    from kit.results import report, table_sets, writers
    run_dirs = [d for d in (run_dir_of(RunConfig.from_dict(p)) for p in profile.points)
                if config_path(d).exists()]
    if not run_dirs:
        return []
    runs = report.load_runs(run_dirs)
    varying = [k for k in dict.fromkeys(k for p in profile.points for k in p)
               if len({json.dumps(p.get(k), sort_keys=True) for p in profile.points}) > 1]
    tables = table_sets.profile_tables(runs, varying)
    paths = writers.write_tables(tables, profile.name, Path(outputs_dir) / "tables")
    if show:
        title, table = next(iter(tables.items()))
        named = table if isinstance(table.index, pd.RangeIndex) else table.reset_index()
        notes = "".join(f"{line}\n" for line in table.attrs.get("notes", ()))
        print(f"\n{title} - {profile.name} (dev sets; {paths[0]})\n{notes}"
              f"{named.to_markdown(index=False)}\n", flush=True)
    return paths + [_figure(profile, kind, outputs_dir, show) for kind in profile.figures]


def _figure(profile: Profile, kind: str, outputs_dir: str, show: bool) -> Path:
    from kit.results import figures
    draw = {"label-quality": figures.label_quality_figure, "cost": figures.cost_figure,
            "gamma": figures.gamma_figure}
    if kind not in draw:
        raise ConfigError(f"{profile.path}: unknown figure {kind!r}; choose from "
                          f"{', '.join(draw)}")
    fig = draw[kind](outputs_dir=outputs_dir, profile=profile.name)
    path = figures.save_figure(fig, outputs_dir, f"{profile.name}-{kind}")
    if show:
        print(f"figure: {path}", flush=True)
    return Path(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kit.batch", description=__doc__.splitlines()[0])
    parser.add_argument("profile", help="a name in params/ (demo, smoke, glue-small ...) or a YAML path")
    parser.add_argument("--shard", help="i/n: run every n-th grid point starting at i")
    parser.add_argument("--outputs", default=os.environ.get("SSA_KIT_OUTPUTS", "outputs"))
    parser.add_argument("--processes", type=int, default=1,
                        help="N > 1: each run data-parallel on N processes (torchrun; one per "
                             "GPU, or CPU processes with gloo); the global batch stays batch_size")
    parser.add_argument("--fresh-kernels", action="store_true",
                        help="start a new notebook kernel for every point (default: one warm "
                             "kernel runs the points one after another)")
    args = parser.parse_args(argv)
    if args.processes < 1:
        parser.error("--processes must be >= 1")
    try:
        return run_profile(args.profile, args.shard, args.outputs, args.processes,
                           args.fresh_kernels)
    except (ConfigError, DataError, ModelError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
