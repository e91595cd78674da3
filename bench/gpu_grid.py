"""bench/gpu.sh's grid part: a small grid of SST-2 and RTE points run by kit.batch with
--per-device K (K points at once on the device), timed per K; and a PROJECTION of
params/paper-base.yaml's wall time from the measured rates and GLUE's real sizes."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from kit.cluster.costs import OFFICIAL_ROWS

REPO = Path(__file__).resolve().parents[1]
# GLUE's train and dev rows (the official release; MNLI's dev: matched + mismatched), from the
# plan's one table of them (kit.cluster.costs.OFFICIAL_ROWS)
GLUE_TRAIN = {task: train for task, (train, _, _) in OFFICIAL_ROWS.items()}
GLUE_DEV = {task: sum(dev) for task, (_, dev, _) in OFFICIAL_ROWS.items()}
# mean WordPiece tokens (BERT uncased, [CLS]/[SEP] included) of the tasks data/glue lacks:
# assumed, not measured here; the others are measured on up to SAMPLE rows of data/glue
ASSUMED_MEAN_TOKENS = {"MRPC": 53.0, "QQP": 30.0, "MNLI": 39.0, "QNLI": 50.0}
SAMPLE = 2000


def grid_profile(folder: Path, model: str, rows: int, seeds: int, max_length: int) -> Path:
    """SST-2 and RTE, method bert, `seeds` seeds each: 2 x seeds points of `rows` rows, 1 epoch."""
    path = folder / "gpu-grid.yaml"
    path.write_text(yaml.safe_dump({"report": False, "grid": {
        "task": ["SST-2", "RTE"], "method": "bert", "seed": list(range(seeds)), "model": model,
        "max_train_examples": rows, "epochs": 1, "batch_size": 32, "max_length": max_length,
        "save_checkpoints": False}}, sort_keys=False))
    return path


def run_grid(profile: Path, k: int, outputs: Path, timeout: float) -> dict:
    """The grid through `python -m kit.batch PROFILE --per-device K`, in a fresh outputs
    folder: its wall time (kernel starts, loading, evaluation included) and what its runs say."""
    cmd = [sys.executable, "-m", "kit.batch", str(profile), "--outputs", str(outputs),
           "--per-device", str(k), "--no-report"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, timeout=timeout, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    records = [json.loads(p.read_text()) for p in outputs.glob("runs/*/metrics.json")]
    ok = [r for r in records if r.get("status") == "ok"]
    examples = sum(r.get("train_examples", 0) for r in ok)
    out = {"k": k, "exit": done.returncode, "wall_s": round(wall, 2), "points_ok": len(ok),
           "points_per_min": round(len(ok) / wall * 60, 3),
           "train_examples_per_s": round(examples / wall, 2)}
    if done.returncode:
        out["error"] = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return out


def mean_tokens(model: str, max_length: int) -> dict[str, dict]:
    """Each GLUE task's mean tokens per example: measured on data/glue's first SAMPLE train
    rows where the project has the task, else ASSUMED_MEAN_TOKENS."""
    from kit.config.run_config import RunConfig
    from kit.data.pipeline import encode, load_task_data
    from kit.models.backbones import load_tokenizer
    tokenizer, out = load_tokenizer(model), {}
    for task in GLUE_TRAIN:
        if not (REPO / "data" / "glue" / task / "train.tsv").exists():
            out[task] = {"mean": ASSUMED_MEAN_TOKENS[task], "source": "assumed"}
            continue
        data = load_task_data(RunConfig(task=task, model=model, max_train_examples=SAMPLE))
        lengths = encode(tokenizer, data.train, max_length, data.task.regression).lengths
        out[task] = {"mean": round(float(lengths.mean()), 1),
                     "source": f"data/glue, {len(lengths)} rows"}
    return out


def project(model_dir: str, useful_flops_per_s: float, per_point_s: float, speedup: float,
            lengths: dict[str, dict]) -> dict:
    """A PROJECTION of params/paper-base.yaml: per point, its training FLOPs (3 x forward) on
    GLUE's train rows and a forward pass of its dev rows per epoch, at the mean length of its
    task, over the kit's measured useful FLOP/s, plus the measured time a point costs beyond
    its training (kernel, loading, evaluation set-up); the grid at K points at once divides it
    by the measured grid speedup. Not in it: SSA's probing and BERT-mask's masked copies (their
    cost per method: bench/ssa_cost.py), test prediction, checkpoint writes."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import common
    from kit.config.profiles import load_profile
    per_task: dict[str, dict] = {}
    for point in load_profile("paper-base").points:
        task, epochs = point["task"], point.get("epochs", 3)
        flops_one = common.training_flops(model_dir, [lengths[task]["mean"]], 1)
        flops = flops_one * (GLUE_TRAIN[task] + GLUE_DEV[task] / 3) * epochs
        row = per_task.setdefault(task, {"points": 0, "seconds": 0.0})
        row["points"] += 1
        row["seconds"] += flops / useful_flops_per_s + per_point_s
    serial = sum(r["seconds"] for r in per_task.values())
    return {"label": "PROJECTION, not a measurement", "per_task": per_task,
            "points": sum(r["points"] for r in per_task.values()),
            "serial_hours": round(serial / 3600, 2),
            "best_k_speedup": round(speedup, 3),
            "hours_at_best_k": round(serial / speedup / 3600, 2),
            "assumptions": " ".join(project.__doc__.split())}
