"""The plan's prediction against the measured wall time of the same profile on this machine:
`./run_all.sh plan PROFILE --json`, then `./run_all.sh PROFILE` into a fresh outputs folder,
timed (both through run_all.sh, as a user runs them: its environment, OMP_WAIT_POLICY=PASSIVE
included; VENV=... as for run_all.sh).

    python bench/plan_wall.py [PROFILE] [--only KEY=V1,V2 ...]     (default: demo)

Prints one line: predicted s, measured s, the error, the device class (docs/benchmarks.md)."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", nargs="?", default="demo")
    parser.add_argument("--only", action="append", default=[])
    args = parser.parse_args(argv)
    only = [f"--only={o}" for o in args.only]
    with tempfile.TemporaryDirectory() as outputs:
        planned = subprocess.run(["bash", str(REPO / "run_all.sh"), "plan", args.profile, *only,
                                  "--json", "--outputs", outputs], cwd=REPO, check=True,
                                 capture_output=True, text=True)
        plan = json.loads(planned.stdout)
        started = time.perf_counter()
        done = subprocess.run(["bash", str(REPO / "run_all.sh"), args.profile, *only,
                               "--outputs", outputs], cwd=REPO)
        measured = time.perf_counter() - started
    predicted = plan["total"]["seconds"]
    print(f"{args.profile}{' ' + ' '.join(args.only) if args.only else ''}: predicted "
          f"{predicted:.0f} s, measured {measured:.0f} s ({(predicted / measured - 1) * 100:+.0f}%)"
          f" on {plan['device']}; batch exit {done.returncode}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
