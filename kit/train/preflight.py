"""A batch's pre-flight: every point's config and every task's data files checked before any
notebook kernel starts, so a typo or a bad file stops the batch in seconds with one line
naming the file (kit.batch, kit.run)."""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from kit import methods
from kit.config.grids import writer
from kit.config.paths import input_path, project_path
from kit.config.profiles import Profile
from kit.config.run_config import ConfigError, RunConfig
from kit.config.tasks import GLUE_TASKS
from kit.data.hub import hub_unreachable
from kit.data.pipeline import glue_source, load_task_data
from kit.data.readers import DataError, MissingTaskFiles
from kit.data.pretrain_text import load_text
from kit.models.backbones import ModelError, check_hub_model, missing_folder
from kit.train import tracking as ktracking
from kit.train.gpu_request import check_gpu_torch

@functools.cache
def _hub_reason() -> str | None:
    return hub_unreachable()


def missing_task_files(cfg: RunConfig) -> str | None:
    """Why a GLUE task cannot run (its folder in glue_dir / GLUE_DIR lacks files, or it is
    found nowhere and the hub is unreachable), else None. A glue_dir / GLUE_DIR that does not
    exist raises DataError."""
    task = GLUE_TASKS.get(cfg.task)          # RunConfig spells task names as the registry does
    if task is None:
        return None
    try:
        source = glue_source(cfg.glue_dir, task.name, cfg.reads_test)
    except MissingTaskFiles as err:
        return str(err)
    reason = _hub_reason() if source == "hub" else None
    return (f"{task.name}: in no glue_dir / GLUE_DIR nor the project's data/glue, and "
            f"the hub is unreachable ({reason}); ./run_all.sh fetch {task.name} on a "
            "networked machine writes it into data/glue") if reason else None


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


def _check_model_folder(model: str, made: dict[Path, int]) -> None:
    """A model folder that does not exist is one ModelError line now, unless an earlier point
    of the batch writes it (its adapted_dir, or a folder inside that: params/tapt-smoke.yaml;
    kit.config.grids.writer, the rule that chains such points in a cluster job)."""
    missing = missing_folder(model)
    if missing and writer(model, made) is None:
        raise ModelError(missing)


def _check_label_source(cfg: RunConfig, ids: set[str], where: Path) -> None:
    """`reuse_labels_from` names a run folder that exists or that a point of the grid writes
    (its run id; one that --only left out blocks the point as it runs, kit.cluster.pool), else
    one line now: the run would fail at its first SSA epoch."""
    source = cfg.reuse_labels_from
    if source and not input_path(source).is_dir() and Path(source).name not in ids:
        raise ConfigError(f"{where}: reuse_labels_from: {source}: no such run folder, and no "
                          "point of this grid is that run")


def preflight(profile: Profile, points: list[dict]) -> dict[str, str]:
    """Check every point's data before any kernel starts; returns {run_id: why} for points to
    skip (their task is found nowhere and the profile says skip_missing_tasks). Raises one-line
    ConfigError / DataError / ModelError for everything else: a task missing from a profile that
    needs it, a glue_dir that does not exist, a malformed file (with its line), a tracker not
    installed, a model folder that is not there (and that no earlier point writes), a
    reuse_labels_from folder that is not there (and is no point's run), a GPU given to this job
    that the installed torch cannot use (kit.train.gpu_request)."""
    check_gpu_torch()
    absent, checked, made = {}, {}, {}
    ids = {RunConfig.from_dict(p).run_id for p in points} | profile.grid_ids
    for i, point in enumerate(points):
        cfg = RunConfig.from_dict(point)
        _check_label_source(cfg, ids, profile.path)
        ktracking.resolve(cfg.report_to)         # an explicit tracker that is not installed
        check_hub_model(cfg.model)               # offline and not cached: one line, now
        _check_model_folder(cfg.model, made)
        if cfg.adapted_dir:
            made[project_path(cfg.adapted_dir)] = i
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
