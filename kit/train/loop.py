"""THE training loop, for every method: one process or many (accelerate launch / torchrun, DDP).

Read top to bottom: `run` is the loop, and the pieces it calls follow it in order: `set_up`,
then per epoch (1) `draw_epoch` (SSA probes with the model from the previous epoch; a multi-task
job samples the task of each batch), (2) `train_epoch`, a `step` per batch, (3) `evaluate` and
`checkpoint_epoch`; `summary` at the end. What differs between a single-task and a multi-task
run is the Job (kit.train.finetune.SingleTask, kit.train.multitask.MultiTask). Everything
written goes through kit.runs.

Data-parallel: every rank builds the same plan of GLOBAL batches (seeded), and each rank takes
its slice of each batch (rows[rank::n]): the global batch is `batch_size` whatever the number of
processes, a run takes the same optimizer steps, and DDP averages the gradients. Evaluation and
SSA probing are sharded the same way and gathered, so every rank sees every prediction and
builds the identical next epoch. Counts are global; only the main process writes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from kit.train import preemption
from kit.train import progress as kprogress
from kit.train import run_state
from kit import runs
from kit.train import tracking as ktracking
from kit.models.regional_compile import capture_graphs, compile_layers, resolve_graphs
from kit.train.accel import (explain_mps_errors, make_accelerator, peak_memory_mb, process_state,
                             reset_peak_memory, resolve_dropout_rng)
from kit.config.run_config import RunConfig
from kit.data.pipeline import Examples
from kit.data.tensors import collate
from kit.train.optim import LinearSchedule, merged_groups, parameter_groups, refuse_other_groups
from kit.config.paths import kit_commit
from kit.train.provenance import environment, points_per_device
from kit.train.step import FORWARD, predict_logits, shard, static_shape, to_device, train_step
from kit.train.window import LossWindow, check_finite, history_row, refuse_non_finite
from kit.train.job import Epoch, Job


# ---------------------------------------------------------------- the loop

def recorded(cfg: RunConfig, build: Callable[[RunConfig], Job]) -> dict:
    """`run` inside the outputs contract's lifecycle (kit.runs.run_recorded: a finished run is
    reused, said in one line, unless rerun; lock, config.json, metrics.json ok / failed /
    preempted with the run's environment), with SIGTERM, SIGUSR1 and SIGINT noted rather than
    fatal (kit.train.preemption): what fit() of every kind of job returns."""
    stop = preemption.Stop(cfg.checkpoint_minutes, cfg.checkpoint_steps)
    trained = []

    def body(c, run_dir):
        trained.append(True)
        return run(c, run_dir, build, stop)

    with preemption.catching(stop):
        metrics = runs.run_recorded(cfg, body, process_state(), environment,
                                    lambda done: kprogress.reused(done, kit_commit()))
    # every run checkpoints while it trains, so a preempted one resumes; without
    # save_checkpoints the folder goes once metrics.json says ok (a kill before that resumes).
    # A reused run keeps its folder: it may have been trained with save_checkpoints on.
    if trained and not cfg.save_checkpoints and process_state().is_main_process:
        run_state.discard(runs.run_dir_of(cfg))
    return metrics


@explain_mps_errors()       # an operator MPS lacks: one line naming it and the way round
def run(cfg: RunConfig, run_dir: Path, build: Callable[[RunConfig], Job],
        stop: preemption.Stop | None = None) -> dict:
    """Train and evaluate one config with the job `build(cfg)` makes (`build` is a Job class);
    returns the metrics. `stop`: the signals noted (kit.train.preemption); when one is, the run
    stops after its current step (or batch of a pass: probing, evaluation, test prediction) with
    a checkpoint and raises kit.runs.RunPreempted."""
    r, inside = set_up(cfg, run_dir, build, stop)
    for epoch in range(r.progress.epoch + 1, cfg.epochs):
        r.job.begin(epoch, r.unwrapped)
        work, inside = draw_epoch(r, epoch, inside), None
        epoch_train_s = train_epoch(r, epoch, work)
        improved = evaluate(r, epoch, work, epoch_train_s)
        checkpoint_epoch(r, epoch, improved)
    if r.job.has_test:                 # GLUE with predict_test, a CSV task's csv_test_path
        predict_test(r)
    return summary(r)


@dataclass
class Loop:
    """What the pieces of one run share once it is set up."""
    cfg: RunConfig
    run_dir: Path
    accelerator: Any
    job: Job
    model: torch.nn.Module              # as accelerate prepared it (DDP, autocast)
    unwrapped: torch.nn.Module
    optimizer: torch.optim.Optimizer
    schedule: LinearSchedule
    stop: preemption.Stop
    shape: Any                          # static batch shapes, or None
    reads: tuple | None                 # the batch keys the job's forward reads (None: all)
    progress: run_state.Progress
    last: Path                          # the checkpoint a preempted run resumes from
    dropout_rng: str
    lr: float                           # a float the loop set: reading it reads no device
    started: float                      # the run's clock, counting the time before a resume

    def predict(self, examples: Examples, desc: str = "eval") -> np.ndarray:
        """Logits of `examples` (stops between batches when a signal is noted)."""
        return predict_logits(self.model, examples, self.cfg.eval_batch_size, self.job.pad_id,
                              self.accelerator, desc, self.stop, self.shape,
                              [k for k in FORWARD if self.reads is None or k in self.reads])


def set_up(cfg: RunConfig, run_dir: Path, build: Callable[[RunConfig], Job],
           stop: preemption.Stop | None) -> tuple[Loop, Any]:
    """The loop set up (a checkpoint resumed), and the mid-epoch state it resumes inside or None."""
    from accelerate.utils import set_seed
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()      # per-checkpoint "Writing model shards" bars
    set_seed(cfg.seed)
    reset_peak_memory()                    # the kernel may have run other points before this one
    trackers = ktracking.trackers(ktracking.resolve(cfg.report_to), cfg.outputs_dir, cfg.profile,
                                  cfg.run_id)
    accelerator = make_accelerator(cfg.mixed_precision, cfg.grad_accum, trackers,
                                   find_unused_parameters=build.find_unused_parameters)
    accelerator.init_trackers(cfg.profile or "runs", config=ktracking.hparams(cfg.to_dict()))
    job = build(cfg)
    job.writer = accelerator.is_main_process     # only the main process writes files
    resolved = resolve_graphs(cfg, accelerator.device.type, job.planned_steps,
                              accelerator.num_processes)
    dropout_rng = resolve_dropout_rng(cfg.dropout_rng, accelerator.device.type,
                                      accelerator.mixed_precision, cfg.compile or resolved.graphs)
    if dropout_rng == "packed":            # before prepare: DDP and autocast wrap the swapped model
        # imported here: it loads transformers' modeling code (and with it scipy), which a
        # kernel importing this loop need not pay for before a model is built
        from kit.models.packed_dropout import use_packed_dropout
        use_packed_dropout(job.model)
    # fused AdamW: one kernel for all parameters (CPU and CUDA); ~8x faster steps on CPU. Its
    # kernels launch per group: the groups of equal settings are one (2 with layer_decay 1)
    optimizer = torch.optim.AdamW(merged_groups(parameter_groups(
        job.model, cfg.lr, cfg.weight_decay, cfg.layer_decay, cfg.freeze_layers)),
        lr=cfg.lr, fused=True)
    refuse_other_groups(optimizer, runs.checkpoint_dir(run_dir))   # an older kit's checkpoint
    job.trainable = {id(p) for p in job.model.parameters() if p.requires_grad}
    model, optimizer = accelerator.prepare(job.model, optimizer)
    unwrapped = accelerator.unwrap_model(model)
    schedule = LinearSchedule(optimizer, cfg.warmup_ratio)
    stop = job.stop = stop or preemption.Stop(cfg.checkpoint_minutes, cfg.checkpoint_steps)
    shape = static_shape(resolved.length_buckets, cfg.max_length,
                         -(-cfg.batch_size // accelerator.num_processes) if job.pads_rows else 0)
    # accelerate saves and restores the model, optimizer and every rank's RNG; run_state this
    # progress (JSON) and, inside an epoch, the epoch's examples and batches as drawn
    progress = run_state.Progress(resolved=resolved.record)   # a checkpoint's must match it
    inside = run_state.resume(accelerator, run_dir, progress, cfg.resume_on_other_hardware)
    if accelerator.is_main_process:
        runs.record_resolved(run_dir, resolved.record)
    job.resumed(progress.epoch + (inside is not None))
    if cfg.compile:     # in place: the model, its state-dict names and checkpoints unchanged
        compile_layers(unwrapped)
    if resolved.graphs:     # likewise
        capture_graphs(unwrapped)
    # lr follows the position in the data, not a count of updates: an fp16 step the loss scaler
    # skips (inf / NaN gradients) loses its update but does not shift the schedule, which stays
    # what resume restores (accelerate's own skip flag is wrong with fused AdamW: docs/gpu.md)
    done = progress.epoch + 1 + (progress.position / len(inside.plan) if inside else 0)
    lr = schedule.set_progress(done / cfg.epochs)
    return Loop(cfg, run_dir, accelerator, job, model, unwrapped, optimizer, schedule, stop, shape,
                job.inputs and (*job.inputs, "weight"), progress,
                runs.checkpoint_dir(run_dir) / "last", dropout_rng, lr,
                time.perf_counter() - progress.elapsed), inside


def draw_epoch(r: Loop, epoch: int, inside) -> Epoch:
    """(1) The epoch's batches: SSA probes with the model as it stands after epoch - 1; or, with
    `inside` (resumed inside this epoch), its batches as drawn, every RNG where it was."""
    p, shown = r.progress, kprogress.shown_epoch(epoch, r.cfg.epochs)
    if inside is not None:
        p.resumed_at = {"epoch": epoch, "position": p.position}
        if r.accelerator.is_local_main_process:
            kprogress.note(f"resumed from a mid-epoch checkpoint: epoch {shown}, batch "
                           f"{p.position}/{len(inside.plan)}, step {p.step}")
        return Epoch(inside.sets, inside.plan, inside.label_stats)
    t0 = time.perf_counter()
    try:
        work = r.job.epoch(epoch, lambda ex: r.predict(ex, f"epoch {shown} label generation"),
                           r.unwrapped)
    except preemption.Interrupted:   # `last` is the previous epoch's end: the resumed run
        raise runs.RunPreempted(     # draws the same labels from the same model again
            r.stop.where(epoch, 0, p.step, r.last, "label generation")) from None
    p.walls["label_generation"] += time.perf_counter() - t0
    if work.label_stats is not None:
        p.label_stats.append(work.label_stats)
    if r.accelerator.num_processes > 1:   # dropout: a stream per rank, reproducible per epoch
        torch.manual_seed(hash((r.cfg.seed, epoch, r.accelerator.process_index)) % 2**63)
    p.position, p.window, p.window_tasks = 0, [], []
    p.epoch_losses, p.epoch_train_s = [[] for _ in r.job.tasks], 0.0
    return work


def train_epoch(r: Loop, epoch: int, work: Epoch) -> float:
    """(2) Train, a `step` per batch from where the epoch stands; its train seconds. Dropout on:
    model.train() every epoch (probing and eval switch it off)."""
    p, accelerator = r.progress, r.accelerator
    t0 = time.perf_counter()
    r.model.train()
    window = LossWindow(accelerator.device)
    window.restore(p.window, p.window_tasks)
    steps = kprogress.bar(work.plan[p.position:],
                          desc=f"epoch {kprogress.shown_epoch(epoch, r.cfg.epochs)} train",
                          initial=p.position, total=len(work.plan),
                          disable=not accelerator.is_local_main_process)
    for i, (t, rows) in enumerate(steps, p.position):
        terms = step(r, epoch, work, i, t, rows)
        window.add(terms, t)
        p.step += 1
        p.trained_examples += len(rows)          # the global batch
        if p.step % r.cfg.log_every == 0 or i == len(work.plan) - 1:
            means, values, tasks = window.read(accelerator)   # the window's one read
            check_finite(values, list(terms), epoch, p.step, accelerator.mixed_precision)
            p.history.append(history_row(
                p.step, round(epoch + (i + 1) / len(work.plan), 4),
                round(time.perf_counter() - r.started, 3), list(terms), means, values,
                tasks, [t.name for t in r.job.tasks], p.epoch_losses, r.lr))
            steps.set_postfix(loss=f"{p.history[-1]['loss']:.4f}", refresh=False)
            accelerator.log(ktracking.step_scalars(p.history[-1]), step=p.step)
        if not accelerator.sync_gradients:   # a checkpoint keeps no half-accumulated gradient
            continue
        stopping, due = r.stop.agreed(p.step, accelerator)
        if stopping or (due and i + 1 < len(work.plan)):
            t0 = checkpoint_inside(r, epoch, work, i + 1, window, list(terms), t0)
        if stopping:
            steps.close()
            raise runs.RunPreempted(r.stop.where(epoch, p.position, p.step, r.last))
    steps.close()
    p.walls["train"] += time.perf_counter() - t0
    return p.epoch_train_s + time.perf_counter() - t0


def step(r: Loop, epoch: int, work: Epoch, i: int, t: int, rows) -> dict:
    """Batch i of the plan (`rows` of task `t`) through the loss, backward and, at the end of an
    accumulation, the optimizer; the loss terms."""
    cfg, accelerator = r.cfg, r.accelerator
    batch = to_device(r.job.on_host(collate(work.sets[t], shard(rows, accelerator),
                                            r.job.pad_id, r.shape), t),
                      accelerator.device, r.reads)
    at = (epoch + (i + 1) / len(work.plan)) / cfg.epochs
    # the epoch's last accumulation may hold fewer batches: it steps at the epoch's end,
    # so no half-accumulated gradient crosses into the next epoch (or past a checkpoint)
    group = min(cfg.grad_accum, len(work.plan) - i // cfg.grad_accum * cfg.grad_accum)
    terms = train_step(accelerator, r.model, r.optimizer,
                       lambda: r.job.loss_terms(r.model, batch, t), cfg.max_grad_norm,
                       lambda: r.schedule.set_progress(at), group, i + 1 == len(work.plan))
    r.lr = r.schedule.lr
    return terms


def checkpoint_inside(r: Loop, epoch: int, work: Epoch, position: int, window: LossWindow,
                      names: list, t0: float) -> float:
    """A mid-epoch checkpoint after `position` batches, the unlogged window kept (a signal, or
    checkpoint_minutes / checkpoint_steps due); the train clock's new start."""
    p = r.progress
    p.window, p.window_tasks = window.saved()
    refuse_non_finite(r.accelerator, r.unwrapped, p.window, names, epoch, p.step,
                      r.accelerator.mixed_precision)
    p.lr = r.lr
    t0 = run_state.save_inside(r.accelerator, r.run_dir, p, work, position, t0, r.started)
    r.stop.checkpointed()
    return t0


def evaluate(r: Loop, epoch: int, work: Epoch, epoch_train_s: float) -> bool:
    """(3) Evaluate on the full dev set(s) and record the epoch; whether it is the best yet."""
    p, accelerator, main = r.progress, r.accelerator, r.accelerator.is_main_process
    t0 = time.perf_counter()
    # the epoch's predictions and checkpoints come from finite weights only: a finite last loss
    # may still have written non-finite ones (one class everywhere, over the best dev.tsv)
    refuse_non_finite(accelerator, r.unwrapped, [], [], epoch, p.step)
    try:
        dev_metrics, three, results = r.job.evaluate(r.predict, r.unwrapped)
    except preemption.Interrupted:      # keep the epoch's training; the resumed run evaluates
        p.window, p.window_tasks, p.lr = [], [], r.lr
        p.epoch_train_s = epoch_train_s
        run_state.save_inside(accelerator, r.run_dir, p, work, len(work.plan),
                              time.perf_counter(), r.started)
        raise runs.RunPreempted(r.stop.where(epoch, len(work.plan), p.step, r.last,
                                             "evaluation")) from None
    if r.cfg.save_epoch_predictions and main:   # the CommonLit recipe: every epoch's predictions
        r.job.write_dev(r.run_dir, results, suffix=f"_epoch{epoch}")
    record = {"epoch": epoch, "dev": dev_metrics, "three_subset": three,
              **r.job.record(epoch, work, p.history, p.epoch_losses),
              "wall_s": round(time.perf_counter() - r.started, 3)}
    p.epochs.append(record)
    improved = p.best is None or dev_metrics["score"] > p.best["dev"]["score"]
    if accelerator.is_local_main_process:
        kprogress.epoch_done(record, r.cfg, best=improved)   # a table row or a line
    accelerator.log(ktracking.epoch_scalars(
        record, work.label_stats, sum(len(rows) for _, rows in work.plan) / epoch_train_s),
        step=p.step)
    if improved:
        p.best = record
        if main:
            r.job.write_dev(r.run_dir, results)
    if main:
        runs.write_history(r.run_dir, p.history)
    p.walls["eval"] += time.perf_counter() - t0
    return improved


def checkpoint_epoch(r: Loop, epoch: int, improved: bool) -> None:
    """(3) `last` with the loop state, `best` if improved; a signal noted meanwhile stops here."""
    p = r.progress
    p.epoch, p.elapsed, p.position = epoch, time.perf_counter() - r.started, None
    # every rank saves its RNG state; `best` where kept or predicting the test (finite: evaluate)
    run_state.save_checkpoints(r.accelerator, r.unwrapped, r.job.tokenizer, r.run_dir,
                               improved and (r.cfg.save_checkpoints or r.job.has_test),
                               r.job.save, p)
    r.stop.checkpointed()
    r.accelerator.wait_for_everyone()     # the other ranks may read the checkpoint next
    if epoch + 1 < r.cfg.epochs and r.stop.agreed(p.step, r.accelerator)[0]:
        raise runs.RunPreempted(      # noted during the epoch's end: after its checkpoint
            r.stop.where(epoch + 1, 0, p.step, r.last, "epoch end"))


def predict_test(r: Loop) -> None:
    r.unwrapped.load_state_dict(r.job.load(runs.checkpoint_dir(r.run_dir) / "best")[0].state_dict())
    try:
        r.job.write_test(r.run_dir, r.predict, r.unwrapped)
    except preemption.Interrupted:      # every epoch is in `last`: the resumed run predicts
        raise runs.RunPreempted(r.stop.where(r.cfg.epochs - 1, None, r.progress.step, r.last,
                                             "test prediction")) from None


def summary(r: Loop) -> dict:
    """The run's metrics: epochs, the best, the job's summary, walls, throughput, device."""
    p, accelerator, walls = r.progress, r.accelerator, r.progress.walls
    walls["total"] = time.perf_counter() - r.started
    for tracker in accelerator.trackers:   # not end_training(): that also ends the process group
        tracker.finish()
    return {"epochs": p.epochs, "best_epoch": p.best["epoch"], **r.job.summary(p, r.unwrapped),
            "wall_s": {k: round(v, 3) for k, v in walls.items()},
            "train_examples": p.trained_examples,
            "train_examples_per_s": round(p.trained_examples / max(walls["train"], 1e-9), 2),
            "peak_memory_mb": peak_memory_mb(), "ssa_labels": p.label_stats,
            "resumed_after_epoch": p.resumed_after_epoch, "resumed_inside_epoch": p.resumed_at,
            "resumed_on_other_hardware": p.other_hardware,
            "processes": accelerator.num_processes, "per_device": points_per_device(),
            "device": str(accelerator.device), "mixed_precision": accelerator.mixed_precision,
            "dropout_rng": r.dropout_rng, **p.resolved}
