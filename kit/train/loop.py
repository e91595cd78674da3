"""THE training loop, for every method: one process or many (accelerate launch / torchrun, DDP).

Read top to bottom: set-up, then per epoch (1) the job builds the epoch's batches (SSA probes
with the model from the previous epoch there; a multi-task job samples the task of each batch),
(2) train, (3) evaluate every task on its full dev set(s), checkpoint. What differs between a
single-task and a multi-task run is the Job (kit.train.finetune.SingleTask,
kit.train.multitask.MultiTask): a single-task run is a mix of one task. Everything written goes
through kit.runs.

Data-parallel: every rank builds the same plan of GLOBAL batches (seeded), and each rank takes
its slice of each batch (rows[rank::n]): the global batch is `batch_size` whatever the number of
processes, a run takes the same optimizer steps, and DDP averages the gradients. Evaluation and
SSA probing are sharded the same way and gathered, so every rank sees every prediction and
builds the identical next epoch. Counts are global; only the main process writes.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from kit.train import preemption
from kit.train import progress as kprogress
from kit.train import run_state
from kit import runs
from kit.train import tracking as ktracking
from kit.models.regional_compile import capture_graphs, compile_layers
from kit.train.accel import (explain_mps_errors, make_accelerator, peak_memory_mb, process_state,
                             reset_peak_memory, resolve_cuda_graphs,
                             resolve_dropout_rng)
from kit.config.run_config import RunConfig
from kit.data.pipeline import Examples
from kit.data.tensors import collate
from kit.train.optim import (LinearSchedule, merged_groups, parameter_groups,
                             refuse_other_groups)
from kit.config.paths import kit_commit
from kit.train.provenance import environment, points_per_device
from kit.train.step import FORWARD, predict_logits, shard, static_shape, to_device, train_step
from kit.train.window import LossWindow, check_finite, history_row, refuse_non_finite
from kit.train.job import Epoch, Job


# ---------------------------------------------------------------- the loop

def recorded(cfg: RunConfig, build: Callable[[RunConfig], Job]) -> dict:
    """`run` inside the outputs contract's frame (kit.runs.run_recorded: a finished run is reused,
    said in one line, unless rerun; lock, config.json, metrics.json ok / failed / preempted with
    the run's environment), with SIGTERM, SIGUSR1 and SIGINT noted rather than fatal
    (kit.train.preemption): what fit() of every kind of job returns."""
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
    from accelerate.utils import set_seed
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()      # per-checkpoint "Writing model shards" bars
    set_seed(cfg.seed)
    reset_peak_memory()                    # the kernel may have run other points before this one
    accelerator = make_accelerator(
        cfg.mixed_precision, cfg.grad_accum, ktracking.trackers(ktracking.resolve(cfg.report_to), cfg.outputs_dir, cfg.profile,
                                cfg.run_id), find_unused_parameters=build.find_unused_parameters)
    accelerator.init_trackers(cfg.profile or "runs", config=ktracking.hparams(cfg.to_dict()))
    main = accelerator.is_main_process
    job = build(cfg)
    job.writer = main                      # only the main process writes files
    graphs = resolve_cuda_graphs(cfg.cuda_graphs, accelerator.device.type, job.planned_steps,
                                 cfg.guide_loss == "task" and not cfg.compile)
    dropout_rng = resolve_dropout_rng(cfg.dropout_rng, accelerator.device.type,
                                      accelerator.mixed_precision, cfg.compile or graphs)
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

    shape = static_shape("on" if graphs else cfg.length_buckets, cfg.max_length,
                         -(-cfg.batch_size // accelerator.num_processes) if job.pads_rows else 0)
    reads = job.inputs and (*job.inputs, "weight")

    def predict(examples: Examples, desc: str = "eval") -> np.ndarray:   # stops between batches
        return predict_logits(model, examples, cfg.eval_batch_size, job.pad_id, accelerator, desc,
                              stop, shape, [k for k in FORWARD if reads is None or k in reads])

    # accelerate saves and restores the model, optimizer and every rank's RNG; run_state this
    # progress (JSON) and, inside an epoch, the epoch's examples and batches as drawn
    last = runs.checkpoint_dir(run_dir) / "last"
    progress = run_state.Progress()
    inside = run_state.resume(accelerator, run_dir, progress, cfg.resume_on_other_hardware)
    job.resumed(progress.epoch + (inside is not None))
    if cfg.compile:     # in place: the model, its state-dict names and checkpoints unchanged
        compile_layers(unwrapped)
    if graphs:          # likewise
        capture_graphs(unwrapped)
    # lr follows the position in the data, not a count of updates: an fp16 step the loss scaler
    # skips (inf / NaN gradients) loses its update but does not shift the schedule, which stays
    # what resume restores (accelerate's own skip flag is wrong with fused AdamW: docs/gpu.md)
    done = progress.epoch + 1 + (progress.position / len(inside.plan) if inside else 0)
    lr = schedule.set_progress(done / cfg.epochs)
    walls = progress.walls
    started = time.perf_counter() - progress.elapsed
    for epoch in range(progress.epoch + 1, cfg.epochs):
        shown = shown_epoch(epoch, cfg)          # progress lines count epochs from 1
        job.begin(epoch, unwrapped)
        if inside is None:
            # (1) the epoch's batches: SSA probes with the model as it stands after epoch - 1
            t0 = time.perf_counter()
            try:
                work = job.epoch(epoch, lambda ex: predict(ex, f"epoch {shown} label generation"),
                                 unwrapped)
            except preemption.Interrupted:   # `last` is the previous epoch's end: the resumed run
                raise runs.RunPreempted(     # draws the same labels from the same model again
                    stop.where(epoch, 0, progress.step, last, "label generation")) from None
            walls["label_generation"] += time.perf_counter() - t0
            if work.label_stats is not None:
                progress.label_stats.append(work.label_stats)
            if accelerator.num_processes > 1:   # dropout: a stream per rank, reproducible per epoch
                torch.manual_seed(hash((cfg.seed, epoch, accelerator.process_index)) % 2**63)
            progress.position, progress.window, progress.window_tasks = 0, [], []
            progress.epoch_losses, progress.epoch_train_s = [[] for _ in job.tasks], 0.0
        else:    # resumed inside this epoch: its batches as drawn, every RNG where it was
            work, inside = Epoch(inside.sets, inside.plan, inside.label_stats), None
            progress.resumed_at = {"epoch": epoch, "position": progress.position}
            if accelerator.is_local_main_process:
                kprogress.note(f"resumed from a mid-epoch checkpoint: epoch {shown}, batch "
                               f"{progress.position}/{len(work.plan)}, step {progress.step}")

        # (2) train: dropout on (model.train() every epoch: probing and eval switch it off)
        t0 = time.perf_counter()
        model.train()
        window, epoch_losses = LossWindow(accelerator.device), progress.epoch_losses
        window.restore(progress.window, progress.window_tasks)
        steps = kprogress.bar(work.plan[progress.position:], desc=f"epoch {shown} train",
                              initial=progress.position, total=len(work.plan),
                              disable=not accelerator.is_local_main_process)
        for i, (t, rows) in enumerate(steps, progress.position):
            batch = to_device(job.on_host(collate(work.sets[t], shard(rows, accelerator),
                                                  job.pad_id, shape), t),
                              accelerator.device, reads)
            at = (epoch + (i + 1) / len(work.plan)) / cfg.epochs
            # the epoch's last accumulation may hold fewer batches: it steps at the epoch's end,
            # so no half-accumulated gradient crosses into the next epoch (or past a checkpoint)
            group = min(cfg.grad_accum, len(work.plan) - i // cfg.grad_accum * cfg.grad_accum)
            terms = train_step(accelerator, model, optimizer,
                               lambda: job.loss_terms(model, batch, t), cfg.max_grad_norm,
                               lambda: schedule.set_progress(at), group, i + 1 == len(work.plan))
            lr = schedule.lr                  # a float the loop set: reading it reads no device
            window.add(terms, t)
            progress.step += 1
            progress.trained_examples += len(rows)          # the global batch
            if progress.step % cfg.log_every == 0 or i == len(work.plan) - 1:
                means, values, tasks = window.read(accelerator)   # the window's one read
                check_finite(values, list(terms), epoch, progress.step,
                             accelerator.mixed_precision)
                progress.history.append(history_row(
                    progress.step, round(epoch + (i + 1) / len(work.plan), 4),
                    round(time.perf_counter() - started, 3), list(terms), means, values,
                    tasks, [t.name for t in job.tasks], epoch_losses, lr))
                steps.set_postfix(loss=f"{progress.history[-1]['loss']:.4f}", refresh=False)
                accelerator.log(ktracking.step_scalars(progress.history[-1]), step=progress.step)
            if not accelerator.sync_gradients:   # a checkpoint keeps no half-accumulated gradient
                continue
            stopping, due = stop.agreed(progress.step, accelerator)
            if stopping or (due and i + 1 < len(work.plan)):
                progress.window, progress.window_tasks = window.saved()
                refuse_non_finite(accelerator, unwrapped, progress.window, list(terms), epoch,
                                  progress.step, accelerator.mixed_precision)
                progress.lr = lr
                t0 = run_state.save_inside(accelerator, run_dir, progress, work, i + 1, t0,
                                           started)
                stop.checkpointed()
            if stopping:
                steps.close()
                raise runs.RunPreempted(stop.where(epoch, progress.position, progress.step, last))
        steps.close()
        walls["train"] += time.perf_counter() - t0
        epoch_train_s = progress.epoch_train_s + time.perf_counter() - t0

        # (3) evaluate on the full dev set(s); checkpoint best, then last with the loop state
        t0 = time.perf_counter()
        try:
            dev_metrics, three, results = job.evaluate(predict, unwrapped)
        except preemption.Interrupted:      # keep the epoch's training; the resumed run evaluates
            refuse_non_finite(accelerator, unwrapped, [], [], epoch, progress.step)
            progress.window, progress.window_tasks, progress.lr = [], [], lr
            progress.epoch_train_s = epoch_train_s
            run_state.save_inside(accelerator, run_dir, progress, work, len(work.plan),
                                  time.perf_counter(), started)
            raise runs.RunPreempted(stop.where(epoch, len(work.plan), progress.step, last,
                                               "evaluation")) from None
        if cfg.save_epoch_predictions and main:   # the CommonLit recipe: every epoch's predictions
            job.write_dev(run_dir, results, suffix=f"_epoch{epoch}")
        record = {"epoch": epoch, "dev": dev_metrics, "three_subset": three,
                  **job.record(epoch, work, progress.history, epoch_losses),
                  "wall_s": round(time.perf_counter() - started, 3)}
        progress.epochs.append(record)
        improved = progress.best is None or dev_metrics["score"] > progress.best["dev"]["score"]
        if accelerator.is_local_main_process:
            kprogress.epoch_done(record, cfg, best=improved)   # a table row or a line
        accelerator.log(ktracking.epoch_scalars(
            record, work.label_stats, sum(len(rows) for _, rows in work.plan) / epoch_train_s),
            step=progress.step)
        if improved:
            progress.best = record
            if main:
                job.write_dev(run_dir, results)
        if main:
            runs.write_history(run_dir, progress.history)
        walls["eval"] += time.perf_counter() - t0
        progress.epoch, progress.elapsed, progress.position = epoch, time.perf_counter() - started, None
        # every rank: each saves its RNG state; `best` only where it is kept or predicts the test
        refuse_non_finite(accelerator, unwrapped, [], [], epoch, progress.step)
        run_state.save_checkpoints(accelerator, unwrapped, job.tokenizer, run_dir,
                                   improved and (cfg.save_checkpoints or job.has_test), job.save,
                                   progress)
        stop.checkpointed()
        accelerator.wait_for_everyone()     # the other ranks may read the checkpoint next
        if epoch + 1 < cfg.epochs and stop.agreed(progress.step, accelerator)[0]:
            raise runs.RunPreempted(      # noted during the epoch's end: after its checkpoint
                stop.where(epoch + 1, 0, progress.step, last, "epoch end"))

    if job.has_test:                   # GLUE with predict_test, a CSV task's csv_test_path
        unwrapped.load_state_dict(job.load(runs.checkpoint_dir(run_dir) / "best")[0].state_dict())
        try:
            job.write_test(run_dir, predict, unwrapped)
        except preemption.Interrupted:      # every epoch is in `last`: the resumed run predicts
            raise runs.RunPreempted(stop.where(cfg.epochs - 1, None, progress.step, last,
                                               "test prediction")) from None
    walls["total"] = time.perf_counter() - started
    for tracker in accelerator.trackers:   # not end_training(): that also ends the process group
        tracker.finish()
    return {"epochs": progress.epochs, "best_epoch": progress.best["epoch"],
            **job.summary(progress, unwrapped),
            "wall_s": {k: round(v, 3) for k, v in walls.items()},
            "train_examples": progress.trained_examples,
            "train_examples_per_s": round(progress.trained_examples / max(walls["train"], 1e-9), 2),
            "peak_memory_mb": peak_memory_mb(), "ssa_labels": progress.label_stats,
            "resumed_after_epoch": progress.resumed_after_epoch,
            "resumed_inside_epoch": progress.resumed_at,
            "resumed_on_other_hardware": progress.other_hardware,
            "processes": accelerator.num_processes, "per_device": points_per_device(),
            "device": str(accelerator.device), "mixed_precision": accelerator.mixed_precision,
            "dropout_rng": dropout_rng, "length_buckets": "off" if shape is None else "on",
            "cuda_graphs": "on" if graphs else "off"}


def shown_epoch(epoch: int, cfg: RunConfig) -> str:
    """`1/2` for epoch 0 of 2: progress lines count from 1; records keep the 0-based index."""
    return f"{kprogress.epoch_number(epoch)}/{cfg.epochs}"


def to_predictions(logits: np.ndarray, regression: bool) -> np.ndarray:
    return logits[:, 0] if regression else logits.argmax(-1)

