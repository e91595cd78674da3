"""A profile's wall time, and what each point pays outside the model, per way of running it.

Contenders, alternated round by round, each a whole `python -m kit.batch PROFILE` into its own
empty outputs folder (so the first point of each task tokenizes; later ones hit the cache):

    warm          this checkout: one kernel runs the points one after another (the default)
    fresh         this checkout with --fresh-kernels: a kernel per point
    REV           any git revision, e.g. ee31b99 (the issue's base): a worktree of it, its own
                  batch; GLUE files from this checkout's data/glue via GLUE_DIR

Per point, the outside cost is the time from the previous point's result line to its own,
less the run's own wall_s.total (metrics.json: the model's training, probing and evaluation):
kernel start, imports, data reading, tokenization, model loading, notebook writing. The first
point also carries the batch's own start (imports, pre-flight); it is shown apart.

    python bench/profile_wall.py --profiles smoke demo --contenders ee31b99,fresh,warm --rounds 2
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from kit.config.grids import point_label


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profiles", nargs="+", default=["smoke"])
    p.add_argument("--contenders", default="fresh,warm")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args()
    meta = common.print_header("Profile wall time and per-point overhead")
    contenders = args.contenders.split(",")
    results = {f"{prof} {c}": [] for prof in args.profiles for c in contenders}
    with tempfile.TemporaryDirectory() as tmp:
        checkouts = {c: checkout(c, Path(tmp)) for c in contenders}
        for r in range(args.rounds):
            for prof in args.profiles:
                for c in (contenders if r % 2 == 0 else contenders[::-1]):
                    got = run_batch(prof, checkouts[c], c == "fresh", Path(tmp) / f"{c}-{prof}-{r}")
                    print(f"round {r + 1} {prof} {c}: wall {got['wall']:.1f} s, cpu "
                          f"{got['cpu']:.1f} s, outside the model: first point {got['first']:.2f}"
                          f" s (with the batch's start), later points {got['outside']:.2f} s "
                          f"(median)", flush=True)
                    results[f"{prof} {c}"].append(got)
        for c in contenders:
            if checkouts[c] != common.REPO:
                subprocess.run(["git", "worktree", "remove", "--force", str(checkouts[c])],
                               cwd=common.REPO, check=True, capture_output=True)
    rows = [[name, got[0]["points"], *(f"{g['wall']:.1f} / {g['cpu']:.1f}" for g in got),
             round(statistics.median(g["first"] for g in got), 2),
             round(statistics.median(g["outside"] for g in got), 2)]
            for name, got in results.items()]
    print()
    print(common.markdown_table(["profile, contender", "points",
                                 *(f"round {i + 1}: wall / CPU s" for i in range(args.rounds)),
                                 "outside the model: first point, s",
                                 "later points, s (median)"], rows))
    common.dump_json(args.json, {**meta, "settings": vars(args), "results": results})


def checkout(contender: str, tmp: Path) -> Path:
    if contender in ("warm", "fresh"):
        return common.REPO
    path = tmp / f"rev-{contender}"
    subprocess.run(["git", "worktree", "add", "--detach", str(path), contender],
                   cwd=common.REPO, check=True, capture_output=True)
    return path


def run_batch(profile: str, repo: Path, fresh: bool, outputs: Path) -> dict:
    """One whole batch: wall and CPU seconds (the batch and its kernels), and per point the time
    from the previous point's result line (for the first: the batch's start) to its own, less
    the run's wall_s.total."""
    env = {**os.environ, "PYTHONPATH": str(repo), "GLUE_DIR": str(common.REPO / "data" / "glue")}
    cmd = [sys.executable, "-m", "kit.batch", profile, "--outputs", str(outputs),
           *(["--fresh-kernels"] if fresh else [])]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True) as proc:
        timed = [(time.perf_counter() - t0, line) for line in proc.stdout]
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(cmd)} exited {proc.returncode}")
    spans = point_spans(timed)
    outside = {}
    for run in (outputs / "runs").iterdir():
        label = point_label(json.loads((run / "config.json").read_text()))
        total = json.loads((run / "metrics.json").read_text())["wall_s"]["total"]
        outside[label] = spans[label] - total
    first, *later = spans
    return {"wall": wall, "points": len(spans),
            "cpu": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
            "first": outside[first], "outside": statistics.median(outside[k] for k in later)}


def point_spans(timed: list[tuple[float, str]]) -> dict[str, float]:
    """{point label: seconds from the previous result line (or the start) to its own} from the
    batch's stdout lines with their arrival times."""
    spans, last = {}, 0.0
    for at, line in timed:
        head, _, status = line.partition(": ")
        if head.startswith("[") and status.startswith(("ok", "failed")):
            spans[head.split("] ", 1)[1]], last = at - last, at
    return spans


if __name__ == "__main__":
    main()
