"""Experiment tracking through accelerate's trackers (`report_to`).

`report_to: [auto]` (the default) is TensorBoard when it is installed (it is a dependency of the
kit), else nothing; `tensorboard`, `wandb`, `mlflow`, `trackio` ask for one explicitly (an
explicit tracker that is not installed is a one-line error before training); `none` is off.

TensorBoard writes one run per grid point, outputs/tb/<profile>/<run_id>/, so
`tensorboard --logdir outputs/tb` compares a whole profile (and the HPARAMS tab its knobs).
W&B / MLflow / trackio get the profile as project (experiment) and the run id as the run's name.
What is logged: the config (once), every logged loss term and the lr at each logging step
(`train/...`), and per epoch the dev metrics (`dev/...`), the SSA label statistics (`ssa/...`)
and the training throughput.
"""
from __future__ import annotations

import importlib.util
from kit.config.paths import outputs_root
from kit.config.run_config import ConfigError
from kit.train.metrics import flatten_metrics

TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow",
            "trackio": "trackio"}   # name -> the module that must be importable


def _installed(name: str) -> bool:
    return importlib.util.find_spec(TRACKERS[name]) is not None


def resolve(report_to: tuple[str, ...]) -> list[str]:
    """The trackers to use for `report_to` (names RunConfig has checked); ConfigError for one
    that is not installed."""
    names = []
    for name in report_to:
        if name == "none":
            continue
        if name == "auto":
            names += ["tensorboard"] if _installed("tensorboard") else []
        elif not _installed(name):
            raise ConfigError(f"parameter 'report_to': {name} is not installed "
                              f"(pip install {name}), or leave it out")
        else:
            names.append(name)
    return list(dict.fromkeys(names))


def trackers(names: list[str], outputs_dir: str, profile: str, run_id: str) -> list:
    """accelerate tracker objects for `names`, laid out one run per grid point."""
    from accelerate.tracking import (MLflowTracker, TensorBoardTracker, TrackioTracker,
                                     WandBTracker)
    group = profile or "runs"
    make = {
        "tensorboard": lambda: TensorBoardTracker(run_id, outputs_root(outputs_dir) / "tb" / group),
        "wandb": lambda: WandBTracker(group, name=run_id),
        "mlflow": lambda: MLflowTracker(experiment_name=group, run_name=run_id),
        "trackio": lambda: TrackioTracker(group, name=run_id),
    }
    return [make[name]() for name in names]


def hparams(config: dict) -> dict:
    """The config as tracker hyperparameters: bool / int / float / str values only."""
    return {k: v if isinstance(v, (bool, int, float, str)) else ",".join(map(str, v))
            if isinstance(v, (list, tuple)) else str(v) for k, v in config.items()}


def step_scalars(row: dict) -> dict:
    """A history.csv row as `train/<term>` scalars (step is the tracker's step)."""
    return {f"train/{k}": v for k, v in row.items() if k not in ("step", "wall_s")
            and isinstance(v, (int, float))}


def epoch_scalars(record: dict, label_stats: dict | None, examples_per_s: float) -> dict:
    """An epoch's dev metrics, SSA label statistics and throughput as scalars."""
    out = {f"dev/{k}": v for k, v in flatten_metrics(record["dev"]).items()}
    three = record.get("three_subset") or {}
    if isinstance(three.get("mean"), (int, float)):        # multi-task runs have one per task
        out["dev/three_subset_mean"] = three["mean"]
    out.update({f"ssa/{k}": v for k, v in (label_stats or {}).items()
                if k != "epoch" and isinstance(v, (int, float)) and not isinstance(v, bool)})
    out["train/examples_per_s"] = examples_per_s
    return out
