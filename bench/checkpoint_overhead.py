"""What mid-epoch checkpoints cost: per checkpoint, per epoch, and as a share of training time.

A mid-epoch checkpoint (RunConfig `checkpoint_minutes`, default 10, and `checkpoint_steps`;
kit.train.preemption.Stop.due) is kit.train.run_state.save_inside -> save_mid_epoch: once per
epoch the epoch's examples and plan (kit.io array files under checkpoint/epoch<N>/), then every
time save_last (accelerate's save_state: model safetensors, AdamW state, RNGs; progress.json).
Three measurements, each in fresh child processes:

    fit      kit.train.finetune.fit on the first --max-train rows, one epoch, --rounds times
             without mid-epoch checkpoints (checkpoint_minutes=0, checkpoint_steps=0) and with
             one every --every-steps steps, alternated (odd rounds in reverse order), each in a
             fresh outputs folder under --workdir. Per checkpoint: the wall difference of the
             pair / the checkpoints written (and the same for the wall outside the loop's train
             and eval clocks, which a checkpoint stops: less noise); and every save_inside call
             timed inside the run. Training examples/s (the loop's own train clock) give the
             seconds per step.
    direct   the task's full train set as a run builds it (SingleTask, its epoch 0 and plan),
             the model and fused AdamW prepared by accelerate as the loop does, a few real
             training steps (AdamW state populated); then --reps times, alternated: save_last,
             the epoch's examples + plan (save_mid_epoch without its save_last), and the same
             for a synthetic Examples of --scale-rows rows (MNLI's 392,702) of ~--scale-tokens
             int64 tokens, with and without SSA labels; each write's size on disk and the
             os.sync() after it (what the page cache had not yet written). save_last replaces
             a previous `last` each time, as every checkpoint but a run's first does.
    overhead per-checkpoint cost / interval + epoch-examples cost / epoch length, at each of
             --intervals minutes (default 10, the default, and 1).

    python bench/checkpoint_overhead.py --threads 1 --json outputs/bench/checkpoint_overhead_sst2.json
    python bench/checkpoint_overhead.py --quick
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

QUICK = {"max_train": 192, "every_steps": 2, "rounds": 1, "reps": 1, "scale_rows": 40000}
MNLI_TRAIN_ROWS = 392702


def main() -> None:
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.set_defaults(task="SST-2", max_train=320, epochs=1)
    parser.add_argument("--every-steps", type=int, default=3,
                        help="fit: the checkpointed run's checkpoint_steps")
    parser.add_argument("--rounds", type=int, default=3, help="fit: pairs of runs (on, off)")
    parser.add_argument("--reps", type=int, default=3, help="direct: repetitions of each write")
    parser.add_argument("--scale-rows", type=int, default=MNLI_TRAIN_ROWS,
                        help="direct: rows of the synthetic epoch (MNLI's train set)")
    parser.add_argument("--scale-tokens", type=float, default=40.0,
                        help="direct: mean tokens per synthetic row")
    parser.add_argument("--intervals", default="10,1", help="checkpoint_minutes to report")
    parser.add_argument("--parts", default="fit,direct", help="fit and / or direct")
    parser.add_argument("--report", metavar="JSON",
                        help="print the tables of an earlier --json file again; measure nothing")
    parser.add_argument("--workdir", default=tempfile.gettempdir(),
                        help="where run folders and checkpoints are written (its disk is measured)")
    args = common.parse(parser, QUICK)
    if args.report:
        saved = json.loads(Path(args.report).read_text())
        print(f"# Mid-epoch checkpoint overhead (from {args.report})\n\ncommand: "
              f"`{saved['command']}`\n\nhardware: "
              + ", ".join(f"{k}={v}" for k, v in saved["hardware"].items()))
        report(argparse.Namespace(**saved["settings"]), saved["fit"], saved["direct"])
        return
    common.check_environment()
    extra = ("every_steps", "reps", "scale_rows", "scale_tokens", "workdir")
    if args.child:
        common.setup_child(args)
        result = run_direct(args) if args.child == "direct" else run_fit(args, args.child == "on")
        common.write_result(args.result, result)
        return

    meta = common.print_header("Mid-epoch checkpoint overhead")
    parts = {p.strip() for p in args.parts.split(",")}
    fits = []
    for r in range(args.rounds if "fit" in parts else 0):
        order = ("off", "on") if r % 2 == 0 else ("on", "off")
        fits.append({name: common.run_child(__file__, common.child_argv(args, extra), name)
                     for name in order})
    direct = common.run_child(__file__, common.child_argv(args, extra), "direct") \
        if "direct" in parts else None
    summary = report(args, fits, direct)
    common.dump_json(args.json, {**meta, "settings": vars(args), "fit": fits, "direct": direct,
                                 "summary": summary})


# ---------------------------------------------------------------- children

def run_fit(args, on: bool) -> dict:
    """One fit(); every save_inside / save_checkpoints call timed from inside the loop."""
    from kit.train import run_state
    from kit.train.finetune import fit
    calls, ends = [], []
    save_inside, save_checkpoints = run_state.save_inside, run_state.save_checkpoints

    def timed_inside(accelerator, run_dir, progress, *rest):
        first = not run_state.epoch_dir(run_dir, progress.epoch + 1).is_dir()
        t0 = time.perf_counter()
        out = save_inside(accelerator, run_dir, progress, *rest)
        calls.append({"s": time.perf_counter() - t0, "with_examples": first,
                      "step": progress.step})
        return out

    def timed_end(*a, **k):
        t0 = time.perf_counter()
        save_checkpoints(*a, **k)
        ends.append(time.perf_counter() - t0)

    run_state.save_inside, run_state.save_checkpoints = timed_inside, timed_end
    out = Path(tempfile.mkdtemp(prefix="ckpt-bench-fit-", dir=args.workdir))
    try:
        cfg = dataclasses.replace(
            common.kit_config(args, str(out)), save_checkpoints=True, checkpoint_minutes=0.0,
            checkpoint_steps=args.every_steps if on else 0)
        t0 = time.perf_counter()
        m = fit(cfg)
        wall = time.perf_counter() - t0
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if m.get("status", "ok") != "ok":
        raise SystemExit(f"fit failed: {m.get('error')}")
    return {"checkpointed": on, "fit_wall_s": wall, "wall_s": m["wall_s"],
            "train_examples": m["train_examples"],
            "train_examples_per_s": m["train_examples_per_s"], "mid_epoch": calls,
            "end_of_epoch_s": ends}


def run_direct(args) -> dict:
    """The run's own objects, built as the loop builds them; then the writes, timed."""
    import numpy as np
    import torch
    from accelerate.utils import set_seed

    from kit.config.run_config import RunConfig
    from kit.data.tensors import collate
    from kit.train import loop, run_state
    from kit.train.accel import make_accelerator
    from kit.train.finetune import SingleTask
    from kit.train.optim import parameter_groups
    from kit.train.step import train_step

    base = Path(args.workdir) / "ssa-kit-checkpoint-bench"     # its token cache is kept
    cfg = RunConfig(task=args.task, model=args.model, seed=args.seed, max_length=args.max_length,
                    batch_size=args.batch_size, lr=args.lr, mixed_precision=args.precision,
                    outputs_dir=str(base), save_checkpoints=True)
    set_seed(cfg.seed)
    accelerator = make_accelerator(cfg.mixed_precision, cfg.grad_accum)
    t0 = time.perf_counter()
    job = SingleTask(cfg)                     # the full train set, tokenized (cached in `base`)
    job.writer = False
    load_s = time.perf_counter() - t0
    optimizer = torch.optim.AdamW(parameter_groups(job.model, cfg.lr, cfg.weight_decay,
                                                   cfg.layer_decay, cfg.freeze_layers),
                                  lr=cfg.lr, fused=True)
    model, optimizer = accelerator.prepare(job.model, optimizer)
    work = job.epoch(0, lambda ex: None, accelerator.unwrap_model(model))
    model.train()
    steps = []
    for t, rows in work.plan[:6]:             # real batches: AdamW's state is populated
        batch = loop.to_device(collate(work.sets[t], rows, job.pad_id), accelerator.device)
        s0 = time.perf_counter()
        train_step(accelerator, model, optimizer,
                   lambda b=batch, t=t: job.loss_terms(model, b, t), cfg.max_grad_norm)
        steps.append({"s": time.perf_counter() - s0, "tokens": int(batch["input_ids"].shape[1])})
    adam_tensors = sum(len(s) for s in optimizer.state.values())   # exp_avg, exp_avg_sq, step
    progress = run_state.Progress(step=len(steps), position=len(steps),
                                  history=[{"step": i, "loss": 0.5} for i in range(50)])
    scale = synthetic_epoch(args.scale_rows, args.scale_tokens, args.batch_size, args.seed)
    scale_ssa = run_state.EpochWork([dataclasses.replace(
        scale.sets[0], ssa_labels=[np.zeros(len(x), np.int64) for x in scale.sets[0].input_ids])],
        scale.plan)
    epochs = {"task": work, "scale": scale, "scale_ssa": scale_ssa}
    timings = {"last": [], **{k: [] for k in epochs}}
    run_dir = Path(tempfile.mkdtemp(prefix="ckpt-bench-direct-", dir=args.workdir))
    try:
        # untimed: every later save_last replaces a previous `last` (renamed, then deleted)
        run_state.save_last(accelerator, run_dir, progress)
        for _ in range(args.reps):
            timings["last"].append(timed_write(
                lambda: run_state.save_last(accelerator, run_dir, progress),
                run_dir / "checkpoint" / "last"))
            for name, w in epochs.items():
                timings[name].append(timed_write(
                    lambda w=w: examples_only(run_state, accelerator, run_dir, progress, w),
                    run_state.epoch_dir(run_dir, progress.epoch + 1)))
                shutil.rmtree(run_state.epoch_dir(run_dir, progress.epoch + 1))
        files = {f.name: f.stat().st_size for f in (run_dir / "checkpoint" / "last").iterdir()}
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    n_params = sum(p.numel() for p in accelerator.unwrap_model(model).parameters())
    return {"load_s": load_s, "steps": steps, "params": n_params, "adam_tensors": adam_tensors,
            "train_rows": len(work.sets[0]), "mean_tokens": float(work.sets[0].lengths.mean()),
            "scale_rows": len(scale.sets[0]),
            "scale_mean_tokens": float(scale.sets[0].lengths.mean()),
            "last_files": files, "timings": timings, "precision": accelerator.mixed_precision}


def examples_only(run_state, accelerator, run_dir, progress, work) -> None:
    """save_mid_epoch's once-per-epoch part: the epoch's examples and plan, not save_last."""
    save_last = run_state.save_last
    run_state.save_last = lambda *a, **k: None
    try:
        run_state.save_mid_epoch(accelerator, run_dir, progress, work)
    finally:
        run_state.save_last = save_last


def timed_write(write, folder: Path) -> dict:
    """Seconds of `write()` (what the loop waits for), its size on disk, then seconds of the
    os.sync() after it (what the page cache still had to write: the whole machine's)."""
    os.sync()
    t0 = time.perf_counter()
    write()
    s = time.perf_counter() - t0
    t0 = time.perf_counter()
    os.sync()
    return {"s": s, "sync_s": time.perf_counter() - t0,
            "bytes": sum(f.stat().st_blocks * 512 for f in folder.rglob("*") if f.is_file())}


def synthetic_epoch(rows: int, mean_tokens: float, batch_size: int, seed: int):
    """An epoch as a pair task's would look: int64 ids and token types, bool special marks,
    int64 labels, lengths ~ normal(mean, mean / 2.5) in [8, 128], its length-grouped plan."""
    import numpy as np

    from kit.data.pipeline import Examples, length_grouped_batches
    from kit.train.run_state import EpochWork
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.rint(rng.normal(mean_tokens, mean_tokens / 2.5, rows)), 8, 128
                      ).astype(np.int64)
    flat = rng.integers(1000, 30000, int(lengths.sum()), dtype=np.int64)
    ids = np.split(flat, np.cumsum(lengths)[:-1])
    types = [(np.arange(n) >= n // 2).astype(np.int64) for n in lengths]
    special = [np.isin(np.arange(n), (0, n // 2 - 1, n - 1)) for n in lengths]
    ex = Examples(ids, types, special, rng.integers(0, 3, rows, dtype=np.int64))
    plan = [(0, b) for b in length_grouped_batches(lengths, batch_size, rng)]
    return EpochWork([ex], plan)


# ---------------------------------------------------------------- the report

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def report(args, fits: list[dict], direct: dict | None) -> dict:
    out = {}
    rows = []
    if fits:
        n_ckpt = [len(f["on"]["mid_epoch"]) for f in fits]
        diff = [(f["on"]["fit_wall_s"] - f["off"]["fit_wall_s"]) / max(n, 1)
                for f, n in zip(fits, n_ckpt)]
        outside = [(outside_s(f["on"]) - outside_s(f["off"])) / max(n, 1)
                   for f, n in zip(fits, n_ckpt)]
        later = [c["s"] for f in fits for c in f["on"]["mid_epoch"] if not c["with_examples"]]
        first = [c["s"] for f in fits for c in f["on"]["mid_epoch"] if c["with_examples"]]
        ends = [s for f in fits for run in f.values() for s in run["end_of_epoch_s"]]
        out["fit"] = {"checkpoints_per_run": n_ckpt, "wall_diff_per_checkpoint_s": diff,
                      "outside_diff_per_checkpoint_s": outside,
                      "save_inside_s": later, "save_inside_first_s": first,
                      "end_of_epoch_s": ends}
        rows += [[f"fit: wall difference / checkpoints ({n_ckpt[0]} per run)", med(diff),
                  _list(diff)],
                 ["fit: the same for the wall outside train + eval (less noise)", med(outside),
                  _list(outside)],
                 ["fit: save_inside timed in the run (not the epoch's first)", med(later),
                  _list(later)],
                 [f"fit: the epoch's first save_inside (+ {args.max_train} rows' examples)",
                  med(first), _list(first)],
                 ["fit: end-of-epoch save_checkpoints (best + last; both runs, not new)",
                  med(ends), _list(ends)]]
        eps = [run["train_examples_per_s"] for f in fits for run in f.values()]
        out["train_examples_per_s"] = med(eps)
    if direct:
        t = direct["timings"]
        labels = {"last": "direct: save_last (model + AdamW + RNG + progress)",
                  "task": f"direct: epoch examples + plan, {args.task} {direct['train_rows']:,} rows",
                  "scale": f"direct: epoch examples + plan, synthetic {direct['scale_rows']:,} rows",
                  "scale_ssa": "direct: the same + SSA labels"}
        for name, label in labels.items():
            got = t[name]
            out[name] = {"s": med([g["s"] for g in got]), "sync_s": med([g["sync_s"] for g in got]),
                         "mb": got[0]["bytes"] / 1e6}
            what = f"{label}; {out[name]['mb']:,.0f} MB on disk, then sync {out[name]['sync_s']:.2f} s"
            rows.append([what, out[name]["s"], _list([g["s"] for g in got])])
        if "train_examples_per_s" not in out:
            s = med([x["s"] for x in direct["steps"][2:]])
            out["train_examples_per_s"] = args.batch_size / s
    print(f"\n{args.task}, model {args.model}, batch {args.batch_size}, max length "
          f"{args.max_length}; workdir {args.workdir}; median of runs (seconds)\n")
    print(common.markdown_table(["what", "median s", "runs"], rows))

    eps = out.get("train_examples_per_s")
    medians = {"save_inside in fit": out["fit"] and med(out["fit"]["save_inside_s"])
               if "fit" in out else None,
               "direct save_last": out["last"]["s"] if "last" in out else None}
    medians = {k: v for k, v in medians.items() if v is not None}
    if eps and medians:
        source = max(medians, key=medians.get)        # the larger: a bound, not a best case
        per_ckpt = medians[source]
        step_s = args.batch_size / eps
        rows = []
        kinds = (("task", args.task), ("scale", f"{args.scale_rows:,} rows"),
                 ("scale_ssa", f"{args.scale_rows:,} rows + SSA labels"))
        for key, name in kinds if direct else ():
            n_rows = direct["train_rows"] if key == "task" else direct["scale_rows"]
            epoch_s, examples_s = n_rows / eps, out[key]["s"]
            for minutes in [float(m) for m in args.intervals.split(",")]:
                every = minutes * 60
                n = int(epoch_s // every)       # mid-epoch checkpoints in an epoch (clock reset
                here = (n * per_ckpt + (n > 0) * examples_s) / epoch_s   # at its end)
                rows.append([name, f"{minutes:g}", round(epoch_s / 60, 1), n,
                             f"{100 * per_ckpt / every:.2f}%", f"{100 * examples_s / epoch_s:.3f}%",
                             f"{100 * here:.2f}%", f"{100 * (per_ckpt + examples_s) / every:.2f}%"])
        out.update(step_s=step_s, per_checkpoint_s=per_ckpt, per_checkpoint_source=source,
                   overhead=rows)
        print(f"\nTraining: {eps:.1f} examples/s ({step_s:.2f} s per step of {args.batch_size}, "
              f"{args.task}). Per checkpoint {per_ckpt:.2f} s: the larger median of "
              + ", ".join(f"{k} {v:.2f} s" for k, v in medians.items()) + ". Epochs at this "
              f"speed ({args.scale_rows:,} rows: at {args.task}'s speed, a lower bound on the "
              "epoch). Mid-epoch checkpoints happen only in an epoch longer than the interval "
              "(the clock restarts at the end-of-epoch checkpoint), so (checkpoint + examples) "
              "/ interval bounds the overhead at any training speed:\n")
        if rows:
            print(common.markdown_table(
                ["epoch of", "checkpoint_minutes", "epoch min here", "checkpoints / epoch",
                 "checkpoint / interval", "examples / epoch", "overhead here",
                 "bound, any speed"], rows))
        print(f"\nBy steps instead: checkpoint_steps=N costs {per_ckpt:.2f} s per N x "
              f"{step_s:.2f} s of training here, e.g. N=100: {100 * per_ckpt / (100 * step_s):.2f}%.")
    return out


def outside_s(run: dict) -> float:
    """fit()'s wall outside the loop's train and eval clocks (a mid-epoch checkpoint stops the
    train clock while it writes): set-up, checkpoints, the test predictions."""
    w = run["wall_s"]
    return run["fit_wall_s"] - w["train"] - w["eval"] - w["label_generation"]


def _list(xs) -> str:
    return " / ".join(f"{x:.2f}" for x in xs)


if __name__ == "__main__":
    main()
