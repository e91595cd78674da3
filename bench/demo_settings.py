"""Choose the demo profile's settings (issue 33, item 5): run candidate demo points one after
another in ONE process and print, per point, its dev score(s) and where its seconds went.

    OMP_NUM_THREADS=1 python bench/demo_settings.py --outputs /tmp/demo-exp \
        --point task=CoLA,method=bert,max_train_examples=400 \
        --point task=CoLA,method=bert,max_train_examples=1600,lr=1e-4 --seeds 0,1,2

Every point takes the old demo's settings (OLD_DEMO: 400 rows, 2 epochs, lr 1e-4, batch 32, max
length 128) unless the point says otherwise; `--base k=v,...` changes them for every point. One
line per run, also appended as JSON to <outputs>/demo_settings.jsonl. A finished run (same
config and outputs folder) is skipped by the kit and reported with its recorded numbers.

The seconds are the run's own (metrics.json wall_s: train, label generation, eval, total) and
the process's CPU seconds for the whole fit (model load included: the fairer number on a shared
machine), measured in-process; a batch point adds the notebook kernel's overhead (about the same for
every point), so compare candidates with each other on the same core, alternated, not with a
batch's wall time. bench/demo_settings.md is the log of what was tried and measured.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


# The demo's grid before issue 33 (one value per axis): every point starts from it, so the logged
# experiments mean the same thing whatever params/demo.yaml says now.
OLD_DEMO = {"model": "minilm", "seed": 0, "epochs": 2, "lr": 1e-4, "batch_size": 32,
            "max_train_examples": 400, "synthetic_size": 1500}


def parse_point(text: str) -> dict:
    point = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        point[key.strip()] = yaml.safe_load(value) if key.strip() != "lr" else float(value)
    return point


def prediction_spread(cfg) -> str:
    """What the best epoch predicted on dev: the share of each predicted class (a constant
    predictor shows one class at 1.0), or a regression's prediction std and range."""
    import numpy as np
    import pandas as pd
    from kit.runs import run_dir_of
    path = run_dir_of(cfg) / "predictions" / "dev.tsv"
    if not path.exists():
        return "n/a"
    frame = pd.read_csv(path, sep="\t", keep_default_na=False)
    values = pd.to_numeric(frame["prediction"], errors="coerce")
    if cfg.task == "STS-B":
        return f"std {np.std(values):.3f} range {values.min():.2f}..{values.max():.2f}"
    shares = frame["prediction"].astype(str).value_counts(normalize=True)
    return " ".join(f"{k}:{v:.2f}" for k, v in shares.items())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--outputs", default="/tmp/demo-exp")
    p.add_argument("--point", action="append", required=True, help="k=v,k=v (RunConfig fields)")
    p.add_argument("--base", default="", help="k=v,... applied to every point first")
    p.add_argument("--seeds", default="0")
    p.add_argument("--repeat", type=int, default=1,
                   help="run each point this many times (timing; later repeats go to "
                        "<outputs>/repeatN so the kit does not skip them)")
    args = p.parse_args()

    from kit.config.run_config import RunConfig
    from kit.train.finetune import fit

    log = Path(args.outputs) / "demo_settings.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"# {platform.processor() or platform.machine()} OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS')} load {os.getloadavg()[0]:.2f}", flush=True)
    for repeat in range(args.repeat):
        outputs = args.outputs if repeat == 0 else f"{args.outputs}/repeat{repeat}"
        for seed in [int(s) for s in args.seeds.split(",")]:
            for text in args.point:
                params = {**OLD_DEMO, "glue_dir": str(REPO / "data" / "glue"),
                          **parse_point(args.base), **parse_point(text), "seed": seed,
                          "outputs_dir": outputs, "report_to": ["none"],
                          "save_checkpoints": False}
                cfg = RunConfig.from_dict(params)
                start, cpu = time.perf_counter(), time.process_time()
                metrics = fit(cfg)
                elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
                dev = metrics.get("best_dev") or {}
                epochs = [round(e["dev"]["score"], 4) for e in metrics.get("epochs") or []]
                wall = metrics.get("wall_s") or {}
                row = {"point": text, "base": args.base, "seed": seed, "run_id": cfg.run_id,
                       "status": metrics.get("status"), "predictions": prediction_spread(cfg),
                       "dev": {k: round(v, 4) for k, v in dev.items()},
                       "epoch_scores": epochs, "best_epoch": metrics.get("best_epoch"),
                       "wall_s": {k: round(v, 1) for k, v in wall.items()},
                       "process_s": round(elapsed, 1),
                       "cpu_s": round(cpu, 1), "load": round(os.getloadavg()[0], 2)}
                with log.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"{text:<60} s{seed} {metrics.get('status')} "
                      f"{' '.join(f'{k}={v:.4f}' for k, v in dev.items())} epochs={epochs} "
                      f"preds={row['predictions']} wall={row['wall_s']} "
                      f"process={elapsed:.1f}s cpu={cpu:.1f}s load={row['load']}",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
