"""CUDA graphs against eager on the paper's own points: the evidence a row of
kit.models.regional_compile.VERIFIED needs (which combinations `cuda_graphs: auto` may graph).
For each paper-base method (bert, ssa-h, ssa-co, bert-mask), BERT-base from its config on SST-2
rows, every run in this one process, one after another (as a batch's warm kernel runs points):

    parity      dropout off: the first PARITY_STEPS training losses and gradient norms (before
                clipping) of the graphed run against eager with the same length buckets (the
                largest relative difference, within TOLERANCE)
    dropout     dropout on, 2 epochs each way: the dev scores and their difference, within
                noise (NOISE_SE standard errors of a difference of two accuracies on that dev)
    cost        the graphed dropout-on run: warm-up s and steady steps/s (gpu_child.Probe),
                peak memory reserved, dynamo's graph breaks and unique graphs, and its
                cudagraph counters (skips, re-recordings)
    resume      the graphed run stopped by SIGTERM inside epoch 2 and resumed (inside the
                epoch), against the uninterrupted graphed run
    grad_accum  bert at grad_accum 2, dropout off, as parity: a replayed backward that
                overwrote or scaled accumulated gradients (pytorch issues 169545, 96693) parts
                the gradient norms from the first optimizer step on

Graphs are forced for the graphed runs (decide_graphs patched: this is what verifies, so it
cannot wait for VERIFIED), inductor's reduce-overhead on a GPU. --cpu-smoke: the tiny random
model, few rows, the aot_eager backend (the capture traced for real, nothing to replay). Each
result is written to results.json as it comes (a lent machine's limit keeps what was measured);
results.md ends with the VERIFIED rows the results support. Adding them is a person's decision,
with a RESULTS_VERSION bump: they change what `auto` computes.

    python bench/graphs_verify.py --out DIR [--cpu-smoke] [--methods bert,ssa-h] [--budget-s 300]
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import common  # noqa: E402
from gpu_child import Probe, around_steps  # noqa: E402

# in the order a short budget covers them: plain BERT, the paper's SSA-H and SSA-Co, BERT-mask
METHODS = ("bert", "ssa-h", "ssa-co", "bert-mask")
PARITY_STEPS = 20
TOLERANCE = {"cuda": 2e-2, "cpu": 1e-4}    # bf16 on a GPU; fp32 through aot_eager on a CPU
NOISE_SE = 2.0
FULL = {"model": "bert-base-random", "task": "SST-2", "rows": 2000, "parity_rows": 640,
        "max_length": 128, "batch_size": 32, "precision": "auto", "budget_s": 420}
SMOKE = {"model": "bert-tiny-random", "task": "SST-2", "rows": 128, "parity_rows": 96,
         "max_length": 32, "batch_size": 8, "precision": "no", "budget_s": 240}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(BENCH.parent / "outputs" / "bench" / "graphs-verify"))
    p.add_argument("--cpu-smoke", action="store_true", help="tiny model, few rows, on the CPU")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--budget-s", type=float, help="no new check starts after (default 420; "
                   "smoke 240)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    s, started, deadline = common.budgeted(args, SMOKE, FULL)
    import torch
    import kit.models.regional_compile as regional
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        regional.GRAPH_BACKEND = "aot_eager"
    s["model"] = common.build_random_model(s["model"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"hardware": common.hardware(), "settings": s, "device": device,
               "tolerance": TOLERANCE[device], "command": sys.argv, "checks": []}

    def record(check: dict) -> None:
        payload["checks"].append(check)
        (out / "results.json").write_text(json.dumps(payload, indent=1, default=float) + "\n")
        print(json.dumps(check, default=float), flush=True)

    # a method's checks together (a VERIFIED row needs all three), grad_accum 2 early: the
    # combination most at risk
    plan = [(m, c) for m in args.methods.split(",") for c in ("parity", "dropout", "resume")]
    if "bert" in args.methods.split(","):
        plan.insert(1, ("bert", "grad_accum"))
    with tempfile.TemporaryDirectory() as runs:     # fresh: a finished run would be skipped
        for method, check in plan:
            if time.monotonic() > deadline:
                record({"method": method, "check": check, "skipped": "over the budget"})
                continue
            try:
                record({"method": method, "check": check,
                        **CHECKS[check](s, method, Path(runs) / method / check, device)})
            except Exception as err:                # noqa: BLE001 - recorded, the rest go on
                record({"method": method, "check": check,
                        "error": f"{type(err).__name__}: {err}"})
    payload["seconds"] = round(time.monotonic() - started, 1)
    payload["verdicts"] = verdicts(payload["checks"], device, dev_rows(s))
    (out / "results.json").write_text(json.dumps(payload, indent=1, default=float) + "\n")
    (out / "results.md").write_text(markdown(payload))
    print((out / "results.md").read_text())
    return payload


# ------------------------------------------------------------------ the runs

def config(s: dict, method: str, folder: Path, graphs: bool, **changes):
    """The point: BERT-base's fine-tuning settings on the bench's rows, a history row a step,
    the same length buckets eager and graphed; `changes` on top."""
    from kit.config.run_config import RunConfig
    settings = dict(task=s["task"], model=s["model"], method=method, seed=0,
                    max_train_examples=s["rows"], max_length=s["max_length"],
                    batch_size=s["batch_size"], epochs=2, lr=2e-5, warmup_ratio=0.1,
                    weight_decay=0.01, mixed_precision=s["precision"], log_every=1,
                    length_buckets="on", cuda_graphs="auto" if graphs else "off",
                    ssa_start_epoch=0, save_checkpoints=False, report_to=("none",),
                    outputs_dir=str(folder / ("graphs" if graphs else "eager")))
    return RunConfig(**{**settings, **changes})


@contextlib.contextmanager
def forced_graphs(on: bool):
    """decide_graphs answers `on` whatever VERIFIED holds (the runs' own records say so)."""
    import kit.models.regional_compile as regional
    decide = regional.decide_graphs
    regional.decide_graphs = lambda *a, **k: (on, "forced by bench/graphs_verify.py") if on \
        else (False, "cuda_graphs: off was asked")
    try:
        yield
    finally:
        regional.decide_graphs = decide


@contextlib.contextmanager
def without_dropout():
    """Every dropout's p set to 0 in the models fit() builds (as tests/test_cuda_graphs.py)."""
    import torch
    import kit.train.finetune as finetune
    build = finetune.SingleTask.__init__

    def built(self, cfg):
        build(self, cfg)
        for module in self.model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    finetune.SingleTask.__init__ = built
    try:
        yield
    finally:
        finetune.SingleTask.__init__ = build


def fit_run(cfg, graphs: bool) -> dict:
    """fit() with graphs forced on or off. No dynamo reset between runs: a batch's warm kernel
    does none, so what one run compiled and recorded meets the next run's new model."""
    from kit.train.finetune import fit
    with forced_graphs(graphs):
        return fit(cfg)


def history(cfg):
    """The run's history.csv: a row per step (log_every 1)."""
    import pandas as pd
    from kit.runs import run_dir_of
    return pd.read_csv(run_dir_of(cfg) / "history.csv")


def losses(cfg, n: int | None = None) -> list[float]:
    """The run's training losses, the first `n` (None: all)."""
    return history(cfg)["loss"].head(n).tolist()


def max_rel(a: list[float], b: list[float]) -> float:
    return max((abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)), default=math.inf)


def parity(s: dict, method: str, folder: Path, device: str, grad_accum: int = 1) -> dict:
    """Dropout off, one epoch of parity_rows: the first PARITY_STEPS losses and gradient norms
    (each optimizer step's, before clipping: what a replayed backward that overwrote or scaled
    the accumulated gradients would change from the first step on, where AdamW's update, blind
    to a gradient's scale, might hide it in the losses), graphed vs eager."""
    runs = {}
    with without_dropout():
        for graphs in (False, True):
            cfg = config(s, method, folder, graphs, epochs=1, grad_accum=grad_accum,
                         max_train_examples=s["parity_rows"])
            with grad_norms() as norms:
                m = fit_run(cfg, graphs)
            runs[graphs] = (losses(cfg, PARITY_STEPS), norms[:PARITY_STEPS], m["cuda_graphs"])
    (eager, eager_norms, e_on), (graphed, graphed_norms, g_on) = runs[False], runs[True]
    return {"graphs_recorded": g_on, "eager_recorded": e_on, "steps": len(graphed),
            "max_rel_diff": max(max_rel(graphed, eager), max_rel(graphed_norms, eager_norms)),
            "eager_losses": eager, "graphed_losses": graphed,
            "eager_grad_norms": eager_norms, "graphed_grad_norms": graphed_norms}


@contextlib.contextmanager
def grad_norms():
    """The total gradient norm of each optimizer step, before clipping, as accelerate's
    clip_grad_norm_ returns it (read back at once: a bench may wait on the device)."""
    import accelerate
    clip, norms = accelerate.Accelerator.clip_grad_norm_, []

    def clipped(self, *args, **kwargs):
        norm = clip(self, *args, **kwargs)
        norms.append(float(norm))
        return norm
    accelerate.Accelerator.clip_grad_norm_ = clipped
    try:
        yield norms
    finally:
        accelerate.Accelerator.clip_grad_norm_ = clip


def grad_accum(s: dict, method: str, folder: Path, device: str) -> dict:
    return {"grad_accum": 2, **parity(s, method, folder, device, grad_accum=2)}


def dropout(s: dict, method: str, folder: Path, device: str) -> dict:
    """Dropout on, 2 epochs each way; the graphed run measured (gpu_child.Probe, counters)."""
    import torch
    from torch._dynamo.utils import counters
    eager_cfg = config(s, method, folder, False)
    eager = fit_run(eager_cfg, False)
    cfg = config(s, method, folder, True, save_checkpoints=True)     # resume's reference too
    # the first epoch's steps, SSA's and BERT-mask's extra rows included: the eager run's
    probe = Probe(int((history(eager_cfg)["epoch"] <= 1).sum()), device == "cuda")
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    counters.clear()
    with around_steps(probe.begin, probe.end):
        graphed = fit_run(cfg, True)
    return {"graphs_recorded": graphed["cuda_graphs"], "eager_dev": last_dev(eager),
            "graphed_dev": last_dev(graphed),
            **{k: v for k, v in probe.summary(s["batch_size"]).items()
               if k in ("steady_steps_per_s", "warmup_s", "first_epoch_s", "steps")},
            "max_memory_reserved_gib": (torch.cuda.max_memory_reserved() / 2 ** 30
                                        if device == "cuda" else None),
            "graph_breaks": sum(counters["graph_break"].values()),
            "unique_graphs": counters["stats"]["unique_graphs"],
            "cudagraph_counters": {k: v for k, v in counters["inductor"].items()
                                   if "cudagraph" in k}}


def resume(s: dict, method: str, folder: Path, device: str) -> dict:
    """The graphed dropout-on run, SIGTERM at 3/4 of its steps (inside epoch 2), then resumed;
    against the same run uninterrupted: the dropout check's (trained here if it did not run)."""
    from kit.runs import RunPreempted, read_metrics, run_dir_of
    straight_cfg = config(s, method, folder.parent / "dropout", True, save_checkpoints=True)
    straight = fit_run(straight_cfg, True)          # finished: its record, read back
    at = len(history(straight_cfg)) * 3 // 4                      # a history row a step
    cfg = config(s, method, folder, True, save_checkpoints=True)
    steps = itertools.count(1)

    def signal_at_step():           # from inside a step, as a scheduler's signal lands
        if next(steps) == at:
            os.kill(os.getpid(), signal.SIGTERM)
    with around_steps(signal_at_step):
        try:
            fit_run(cfg, True)
            stopped = None
        except RunPreempted:
            stopped = read_metrics(run_dir_of(cfg))["preempted"]
    resumed = fit_run(cfg, True)
    return {"signal_at_step": at, "stopped": stopped is not None,
            "resumed_inside_epoch": resumed.get("resumed_inside_epoch"),
            "straight_dev": last_dev(straight), "resumed_dev": last_dev(resumed),
            "bit_equal_dev": last_dev(straight) == last_dev(resumed),
            "max_rel_loss_diff": max_rel(losses(cfg), losses(straight_cfg))}


CHECKS = {"parity": parity, "grad_accum": grad_accum, "dropout": dropout, "resume": resume}


def last_dev(metrics: dict) -> dict:
    return metrics["epochs"][-1]["dev"]


def dev_rows(s: dict) -> int:
    from kit.config.run_config import RunConfig
    from kit.data.pipeline import load_task_data
    data = load_task_data(RunConfig(task=s["task"], model=s["model"], seed=0,
                                    max_train_examples=s["rows"]))
    return len(next(iter(data.dev.values())))


# ------------------------------------------------------------------ verdicts and the page

def verdicts(checks: list[dict], device: str, rows: int) -> dict:
    """Per method: each check passed, failed (why) or not run; and the VERIFIED rows the
    passes support on a GPU: (method, 1, 1) when parity, dropout and resume passed, ("bert",
    2, 1) when grad_accum passed too (none on a CPU: there nothing replays). Losses within
    TOLERANCE[device]; dev scores within noise: NOISE_SE standard errors of a difference of two
    accuracies near 0.5 on `rows` dev rows."""
    tolerance, noise = TOLERANCE[device], NOISE_SE * math.sqrt(2 * 0.25 / rows)
    out: dict = {}
    for c in checks:
        v = out.setdefault(c["method"], {})
        if "error" in c or "skipped" in c:
            v[c["check"]] = f"not run: {c.get('error') or c['skipped']}"
        elif c["check"] in ("parity", "grad_accum"):
            ok = c["graphs_recorded"] == "on" and c["max_rel_diff"] <= tolerance
            v[c["check"]] = "passed" if ok else (
                f"failed: losses or gradient norms differ by {c['max_rel_diff']:.2g} "
                f"(relative; tolerance {tolerance:g}), graphs {c['graphs_recorded']}")
        elif c["check"] == "dropout":
            gap = abs(c["graphed_dev"]["score"] - c["eager_dev"]["score"])
            ok = c["graphs_recorded"] == "on" and gap <= noise and not c["graph_breaks"]
            v["dropout"] = "passed" if ok else (
                f"failed: dev score differs by {gap:.3f} (noise {noise:.3f}), "
                f"{c['graph_breaks']} graph break(s)")
        elif c["check"] == "resume":
            gap = abs(c["resumed_dev"]["score"] - c["straight_dev"]["score"])
            ok = c["stopped"] and c["resumed_inside_epoch"] and gap <= noise
            v["resume"] = "passed" if ok else (
                f"failed: stopped {c['stopped']}, resumed inside {c['resumed_inside_epoch']}, "
                f"dev score differs by {gap:.3f}")
    verified = [(m, 1, 1) for m, v in out.items() if device == "cuda"
                and all(v.get(k) == "passed" for k in ("parity", "dropout", "resume"))]
    if ("bert", 1, 1) in verified and out["bert"].get("grad_accum") == "passed":
        verified.append(("bert", 2, 1))
    return {"noise": noise, "methods": out, "verified_rows": verified}


def markdown(p: dict) -> str:
    v, hw = p["verdicts"], p["hardware"]
    lines = [f"# CUDA graphs against eager ({p['device']}, {p['seconds']} s)", "",
             f"{hw}", "", f"Settings: {json.dumps(p['settings'])}; loss tolerance "
             f"{p['tolerance']:g} (relative), dev noise {v['noise']:.3f}.", "",
             "| method | parity | grad_accum 2 | dropout on | resume |", "|---|---|---|---|---|"]
    for method, checks in v["methods"].items():
        lines.append(f"| {method} | " + " | ".join(checks.get(k, "-") for k in
                                                    ("parity", "grad_accum", "dropout", "resume"))
                     + " |")
    lines += ["", "| method | steady steps/s | warm-up s | peak reserved GiB | graph breaks | "
              "unique graphs | cudagraph counters |", "|---|---|---|---|---|---|---|"]
    cell = lambda x: "-" if x is None else f"{x:.3g}"       # noqa: E731
    for c in p["checks"]:
        if c["check"] == "dropout" and "graphed_dev" in c:
            lines.append(f"| {c['method']} | {cell(c['steady_steps_per_s'])} | "
                         f"{cell(c['warmup_s'])} | {cell(c['max_memory_reserved_gib'])} | "
                         f"{c['graph_breaks']} | {c['unique_graphs']} | "
                         f"{c['cudagraph_counters'] or '-'} |")
    rows = ", ".join(f"Verified({m!r}, {g}, {n}, ...)" for m, g, n in v["verified_rows"])
    lines += ["", "VERIFIED rows these results support (a person adds them, with a "
              f"RESULTS_VERSION bump): {rows or 'none'}"
              + (" (a CPU checks the harness: nothing replays there)" if p["device"] == "cpu"
                 else "") + ".", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
