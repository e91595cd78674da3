"""Signal to exit through the batch, as SLURM's warning reaches it: SIGUSR1 to
`python -m kit.batch PROFILE` (one process, or `--processes 2`: torchrun and two gloo workers)
while its one point trains, and the seconds until the batch has exited (75: stopped with a
checkpoint). The one- and two-process runs alternate, `--rounds` each.

The point: --task (real GLUE from the project), minilm, method bert, fp32, one epoch of
--max-train rows, a mid-epoch checkpoint every --checkpoint-steps steps. The signal goes
--settle seconds after the run's first checkpoint appeared, so it lands inside a training step
(bench/signal_latency.py measures the other passes, in one process).

    python bench/signal_latency_batch.py --rounds 2
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def one_stop(workdir: Path, processes: int, args) -> dict:
    """Start the batch on a one-point profile, SIGUSR1 it inside training, time its exit."""
    from kit.config.run_config import RunConfig
    from kit.runs import run_dir_of
    point = {"task": args.task, "model": "minilm", "method": "bert", "epochs": 1, "lr": 1e-4,
             "max_train_examples": args.max_train, "mixed_precision": "no",
             "checkpoint_steps": args.checkpoint_steps}
    profile = workdir / "latency.yaml"
    profile.write_text(json.dumps({"grid": point}))
    out = workdir / "out"
    cmd = [sys.executable, "-m", "kit.batch", str(profile), "--outputs", str(out), "--no-report"]
    if processes > 1:
        cmd += ["--processes", str(processes)]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, args.threads // processes)),
           "SSA_KIT_PROGRESS": "off"}
    run = run_dir_of(RunConfig(**point, outputs_dir=str(out.resolve()), profile="latency"))
    log = (workdir / "batch.log").open("w")
    batch = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    last = run / "checkpoint" / "last"
    while not last.exists():
        if batch.poll() is not None:
            raise SystemExit(f"the batch ended before its first checkpoint: {workdir}/batch.log")
        time.sleep(0.02)
    time.sleep(args.settle)
    sent = time.perf_counter()
    batch.send_signal(signal.SIGUSR1)
    code = batch.wait(timeout=600)
    took = time.perf_counter() - sent
    record = json.loads((run / "metrics.json").read_text())
    return {"processes": processes, "signal_to_exit_s": round(took, 2), "exit": code,
            "status": record["status"],
            **{k: (record.get("preempted") or {}).get(k) for k in ("signal", "during", "step")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="SST-2")
    parser.add_argument("--max-train", type=int, default=4000)
    parser.add_argument("--checkpoint-steps", type=int, default=10)
    parser.add_argument("--settle", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=2, help="cores, shared by the processes")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    hardware = common.hardware()
    print(f"CPU {hardware['cpu']} ({hardware['cpu_class']}), {args.threads} thread(s) in all, "
          f"{args.task} {args.max_train} rows, minilm fp32, SIGUSR1 {args.settle} s after the "
          f"first checkpoint\n")
    results = {1: [], 2: []}
    for r in range(args.rounds):
        for processes in (1, 2):
            with tempfile.TemporaryDirectory() as tmp:
                got = one_stop(Path(tmp), processes, args)
            print(json.dumps(got), flush=True)
            results[processes].append(got["signal_to_exit_s"])
    for processes, times in results.items():
        print(f"{processes} process(es): signal -> batch exit median {statistics.median(times):.2f} s "
              f"(min {min(times):.2f}, max {max(times):.2f}, {len(times)} rounds)")


if __name__ == "__main__":
    main()
