"""What a batch pays besides its points' own runs, measured by running one (kit.plan).

`./run_all.sh PROFILE` is a process that starts a notebook kernel, runs each point's notebook
in it and ends with the tables and the report. Around each run's own `wall_s.total` that is:
once, the process's start and imports, the kernel's start and its first imports, the tables
and report; and for every point its notebook around the run (papermill, the cells after fit(),
the namespace reset before the next). `batch_probe` times the same things on this machine by
running `python -m kit.batch` on PROBE_GRID, two points of the tiny model, in a temporary
folder: ~10 s.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from kit import runs
from kit.config.paths import PROJECT
from kit.config.profiles import load_profile
from kit.config.run_config import ConfigError, RunConfig

# two points of the tiny model, a second or so each: what is timed is the batch around them
PROBE_GRID = {"task": "synthetic", "method": "bert", "seed": [0, 1], "model": "tiny",
              "synthetic_size": 64, "epochs": 1, "lr": 5.0e-3, "save_checkpoints": False}
NOT_PROBED = {"once_s": 0.0, "per_point_s": 0.0}     # where a margin holds it (kit.slurm)


def batch_probe() -> dict:
    """{"once_s", "per_point_s"}: `per_point_s` the second point's notebook around its run
    (the gap after the first notebook and its own time beyond wall_s.total), which the kernel's
    start does not touch; `once_s` the rest of the batch's wall time beyond its runs."""
    with tempfile.TemporaryDirectory() as folder:
        profile = Path(folder) / "plan-probe.yaml"
        profile.write_text(yaml.safe_dump({"grid": PROBE_GRID}))
        outputs = str(Path(folder) / "outputs")
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "kit.batch", str(profile), "--outputs",
                               outputs], cwd=PROJECT, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        dirs = [runs.run_dir_of(RunConfig.from_dict(p))
                for p in load_profile(str(profile), outputs).points]
        spans = [runs.notebook_span(d) for d in dirs]
        walls = [(runs.read_metrics(d) or {}).get("wall_s", {}).get("total") for d in dirs]
    if done.returncode or None in spans or None in walls:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:]
        raise ConfigError(f"the plan's probe batch (two points of the tiny model on the "
                          f"synthetic task) failed, exit {done.returncode}: {' '.join(last)}")
    (_, end1), (_, end2) = spans
    per_point = max(end2 - end1 - walls[1], 0.0)
    return {"once_s": round(max(seconds - sum(walls) - 2 * per_point, 0.0), 1),
            "per_point_s": round(per_point, 2)}
