"""bench/gpu.sh: the kit on one GPU, before and after, against the Trainer, in one command.

Per contender and round (alternated: A B C, C B A): steady steps/s and examples/s, first-epoch
warm-up, host syncs per training step and per evaluation batch, kernels per step, the GPU's busy
share, useful TFLOP/s and their share of the bf16 matmul peak measured here (bench/gpu_child.py
says how). Contenders: kit, kit-buckets (length_buckets on), kit-graphs (cuda_graphs on),
kit-old (the kit of commit OLD_COMMIT, from a git worktree this script makes and removes, or
the folder --old-kit names: a machine given the tree without its git history), trainer-grouped (bf16),
trainer-compiled (torch_compile, reduce-overhead). Then a grid of SST-2 and RTE points through
kit.batch with --per-device K for each K (bench/gpu_grid.py), and a PROJECTION of
params/paper-base.yaml's wall time from the measured rates. Every contender and grid run is
tried on its own (its error recorded, the rest goes on) within a total time budget. Writes
results.json and results.md into --out.

    python bench/gpu_bench.py --out outputs/bench/gpu-run          # on a CUDA machine
    python bench/gpu_bench.py --cpu-smoke --out /tmp/gpu-smoke     # the same path, tiny, CPU
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import common  # noqa: E402
import gpu_grid  # noqa: E402
from gpu_child import CONTENDERS  # noqa: E402

REPO = BENCH.parent
OLD_COMMIT = "a274152"          # the kit before the GPU-first changes (issue #52)
FULL = {"model": "bert-base-random", "task": "SST-2", "rows": 4000, "max_length": 128,
        "batch_size": 32, "precision": "auto", "peak_size": 8192, "grid_rows": 1000,
        "grid_seeds": 2, "budget_s": 420}
SMOKE = {"model": "bert-tiny-random", "task": "RTE", "rows": 96, "max_length": 64,
         "batch_size": 8, "precision": "no", "peak_size": 256, "grid_rows": 32,
         "grid_seeds": 1, "budget_s": 240, "threads": 1}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(REPO / "outputs" / "bench" / "gpu"))
    p.add_argument("--cpu-smoke", action="store_true", help="tiny model, few steps, on the CPU")
    p.add_argument("--contenders", help=f"comma-separated, of {', '.join(CONTENDERS)} (default: "
                   "all; --cpu-smoke: all but the compiled two)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--grid-k", default="1,2,4", help="K values for --per-device ('' skips)")
    p.add_argument("--budget-s", type=float, help="total seconds (default 420; smoke 240)")
    p.add_argument("--old-kit", help=f"a folder holding the project at {OLD_COMMIT} (default: a "
                   "git worktree of it)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    s, started, deadline = common.budgeted(args, SMOKE, FULL)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    s["model"] = common.build_random_model(s["model"])
    meta = {"hardware": common.hardware(), "settings": s, "command": sys.argv,
            "started": time.strftime("%Y-%m-%d %H:%M:%S"), "cpu_smoke": args.cpu_smoke}
    peak = measure_peak(s)
    per_example = useful_flops_per_example(s)
    # torch_compile on a CPU compiles for minutes: the smoke leaves it out unless named
    names = [n for n in (args.contenders or ",".join(
        c for c in CONTENDERS if not (args.cpu_smoke and c in ("trainer-compiled", "kit-graphs")))).split(",") if n]
    with tempfile.TemporaryDirectory() as tmp:
        old = (args.old_kit or old_kit(Path(tmp))) if "kit-old" in names else None
        results = []
        for round_ in range(args.rounds):
            for name in names if round_ % 2 == 0 else names[::-1]:
                # the contenders get the first 60% of the budget, the grid the rest (all of it
                # when no grid is asked for)
                share = 0.6 if args.grid_k else 1.0
                left = started + share * (deadline - started) - time.monotonic()
                r = tried(lambda: run_child(name, s, Path(tmp), left, old), left)
                r.update(contender=name, round=round_)
                rate = r.get("steady_examples_per_s")
                r["useful_tflops"] = rate and rate * per_example / 1e12
                r["share_of_bf16_peak"] = rate and rate * per_example / peak["flops_per_s"]
                results.append(r)
                # what is measured so far survives a kill of the whole run (a lent machine's
                # time limit): results.json comes at the end
                (out / "contenders.json").write_text(json.dumps(results, indent=1, default=float))
        grids = run_grids(s, [int(k) for k in args.grid_k.split(",") if k], Path(tmp), deadline)
        if old and isinstance(old, str) and not args.old_kit:
            subprocess.run(["git", "worktree", "remove", "--force", old], cwd=REPO,
                           capture_output=True)
    payload = {**meta, "peak": peak, "useful_flops_per_example": per_example,
               "contenders": results, "grid": grids,
               "projection": tried(lambda: projection(s, results, grids, per_example), 1),
               "seconds": round(time.monotonic() - started, 1)}
    (out / "results.json").write_text(json.dumps(payload, indent=1, default=float) + "\n")
    (out / "results.md").write_text(markdown(payload))
    print((out / "results.md").read_text())
    return payload


def tried(work, seconds_left: float) -> dict:
    """`work()`, or what stopped it: no time left, or its error in one line."""
    if seconds_left <= 0:
        return {"error": "skipped: the time budget was spent"}
    try:
        return work()
    except Exception as err:
        last = str(err).strip().splitlines()[-1:]
        return {"error": f"{type(err).__name__}: {last[0] if last else ''}"[:400]}


def measure_peak(s: dict) -> dict:
    """The bf16 matmul peak (a size x size torch.mm, 2 s); on a CPU without native bf16, fp32."""
    dtype = "bfloat16" if common.native_bf16() else "float32"
    return common.matmul_peak(size=s["peak_size"], seconds=2.0 if s["peak_size"] > 1024 else 0.1,
                              dtype=dtype)


def useful_flops_per_example(s: dict) -> float:
    """Model FLOPs of training one example of the contenders' rows, padding not counted."""
    from kit.config.run_config import RunConfig
    from kit.data.pipeline import encode, load_task_data
    from kit.models.backbones import load_tokenizer
    data = load_task_data(RunConfig(task=s["task"], model=s["model"], max_train_examples=s["rows"]))
    lengths = encode(load_tokenizer(s["model"]), data.train, s["max_length"],
                     data.task.regression).lengths
    return common.training_flops(s["model"], lengths, 1) / len(lengths)


def old_kit(tmp: Path) -> str | dict:
    """A git worktree of OLD_COMMIT (its folder), or why there is none."""
    folder = tmp / f"kit-{OLD_COMMIT}"
    done = subprocess.run(["git", "worktree", "add", "--detach", str(folder), OLD_COMMIT],
                          cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        return {"error": f"no worktree of {OLD_COMMIT}: {done.stderr.strip()[-300:]}"}
    return str(folder)


def run_child(name: str, s: dict, tmp: Path, timeout: float, old) -> dict:
    """bench/gpu_child.py NAME in a fresh process (kit-old: with the old kit first on its path)."""
    if name == "kit-old" and not isinstance(old, str):
        return old or {"error": "no old kit"}
    settings, result = tmp / "settings.json", tmp / f"{name}.json"
    settings.write_text(json.dumps(s))
    result.unlink(missing_ok=True)
    cmd = [sys.executable, str(BENCH / "gpu_child.py"), name,
           "--settings", str(settings), "--result", str(result)]
    if name == "kit-old":
        cmd += ["--kit-root", old]
    print(f"--- {name}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=old if name == "kit-old" else REPO, timeout=timeout,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode or not result.exists():
        tail = done.stderr.strip().splitlines()[-1:] if done.stderr.strip() else []
        return {"error": f"exit {done.returncode}: {' '.join(tail)[-400:]}"}
    return {**json.loads(result.read_text()), "process_s": round(time.perf_counter() - t0, 1)}


def run_grids(s: dict, ks: list[int], tmp: Path, deadline: float) -> list[dict]:
    profile = gpu_grid.grid_profile(tmp, s["model"], s["grid_rows"], s["grid_seeds"],
                                    s["max_length"])
    out = []
    for k in ks:
        left = deadline - time.monotonic()
        r = tried(lambda: gpu_grid.run_grid(profile, k, tmp / f"grid-k{k}", left), left)
        out.append({"k": k, **r})
    base = next((g["wall_s"] for g in out if g["k"] == 1 and "wall_s" in g), None)
    for g in out:
        g["speedup_vs_k1"] = round(base / g["wall_s"], 3) if base and g.get("wall_s") else None
    return out


def projection(s: dict, results: list[dict], grids: list[dict], per_example: float) -> dict:
    """paper-base.yaml's projected wall time: the kit's median steady useful FLOP/s, the time a
    grid point costs beyond its training (K = 1), the best K's speedup."""
    import statistics
    rates = [r["steady_examples_per_s"] * per_example for r in results
             if r["contender"] == "kit" and r.get("steady_examples_per_s")]
    single = next((g for g in grids if g["k"] == 1 and g.get("points_ok")), None)
    if not rates or single is None:
        return {"error": "no kit rate or no K = 1 grid measured: nothing to project from"}
    rate = statistics.median(rates)
    train_s = (single["train_examples_per_s"] * single["wall_s"]) * per_example / rate
    per_point = max(0.0, (single["wall_s"] - train_s) / single["points_ok"])
    speedup = max([g["speedup_vs_k1"] or 1.0 for g in grids] + [1.0])
    lengths = gpu_grid.mean_tokens(s["model"], s["max_length"])
    return {**gpu_grid.project(s["model"], rate, per_point, speedup, lengths),
            "useful_flops_per_s": rate, "per_point_overhead_s": round(per_point, 2),
            "mean_tokens": lengths}


def markdown(p: dict) -> str:
    def cell(v, f="{:.3g}"):
        return "-" if v is None else f.format(v) if isinstance(v, (int, float)) else str(v)
    keys = ("steady_steps_per_s", "steady_examples_per_s", "warmup_s", "syncs_per_train_step",
            "syncs_per_eval_batch", "kernels_per_step", "gpu_busy_share", "useful_tflops",
            "share_of_bf16_peak")
    lines = [f"# bench/gpu.sh{' --cpu-smoke' if p['cpu_smoke'] else ''} ({p['started']})", "",
             f"hardware: {p['hardware'].get('gpu') or p['hardware']['cpu']}; peak "
             f"{p['peak']['dtype']} matmul {p['peak']['flops_per_s'] / 1e12:.3g} TFLOP/s "
             f"({p['peak']['size']}^2)", "",
             "| contender | round | " + " | ".join(keys) + " | error |",
             "|" + "---|" * (len(keys) + 3)]
    lines += [f"| {r['contender']} | {r['round']} | " + " | ".join(cell(r.get(k)) for k in keys)
              + f" | {r.get('error', '')} |" for r in p["contenders"]]
    lines += ["", "| --per-device K | wall s | points ok | points/min | train ex/s | speedup "
              "| error |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {g['k']} | {cell(g.get('wall_s'))} | {cell(g.get('points_ok'))} | "
              f"{cell(g.get('points_per_min'))} | {cell(g.get('train_examples_per_s'))} | "
              f"{cell(g.get('speedup_vs_k1'))} | {g.get('error', '')} |" for g in p["grid"]]
    proj = p["projection"]
    lines += ["", "## params/paper-base.yaml: a PROJECTION, not a measurement", ""]
    lines += ([f"error: {proj['error']}"] if "error" in proj else [
        f"{proj['points']} points: {proj['serial_hours']} h one at a time, "
        f"{proj['hours_at_best_k']} h at the best measured K (x{proj['best_k_speedup']})", "",
        proj["assumptions"]])
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
