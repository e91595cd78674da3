"""Multi-task training: EmBERT (task-embedded attention) and Gated-BERT on a mix of tasks.

    fit_multitask(RunConfig(task="multitask", tasks=("RTE", "CoLA", "STS-B"), method="embert"))

The schedule (EmBERT / Bert-n-Pals): an epoch is a fixed number of single-task batches
(`steps_per_epoch`, default: all tasks' train rows / batch size); the task of each batch is drawn
with p_i proportional to N_i^a, N_i the task's train rows:
    prop a = 1, sqrt a = 0.5, anneal a = 1 - 0.8 * e / (E - 1) (epoch e of E: proportional at
    the start, nearly uniform at the end), round-robin: tasks in turn.
Each task's batches come from its own endless stream of length-grouped passes over its rows.

Evaluation after every epoch: every task on its full dev set(s) with its official metric.
Model selection: the epoch with the highest MEAN of the task scores (kit.metrics.task_score; the
GLUE average; the released code picks on the sum, which selects the same epoch).

Output (the kit.train.fit contract, outputs/runs/<run_id>/): config.json, metrics.json (status
ok/failed), history.csv (loss and per-task loss per logging window), predictions/<TASK>/<split>.tsv,
checkpoint/{best,last} (kit.models.save_model layout; reload with load_multitask; `last` also holds
the loop state, so a killed run resumes after its last finished epoch). metrics.json:
  epochs[i]["dev"]   = {task: metrics, ..., "score": mean task score}
  best_dev           = {"score": ..., "<TASK>/<metric>": ...}  (flat, so report tables read it)
  per_task           = {task: best-epoch dev metrics}, comparable with a single-task run's best_dev
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from kit import io as kio
from kit import metrics as kmetrics
from kit import progress as kprogress
from kit import tracking as ktracking
from kit.config import MULTITASK_METHODS, ConfigError, RunConfig
from kit.data import collate, encode, length_grouped_batches, load_task_data, random_batches
from kit.models import load_backbone, target_loss
from kit.multitask_models import MultiTaskModel, MultiTaskSpec, apply_stage, load_multitask
from kit.optim import parameter_groups
from kit.tasks import get_task
from kit.train import (LinearSchedule, Progress, _accelerator, _check_finite, _label_text,
                       _peak_memory_mb, _predict_logits, _resume, _save_checkpoints, _to_device,
                       _to_predictions, _write_history, run_recorded)

SAMPLING = ("prop", "sqrt", "anneal", "round-robin")
SELECTION = "mean of the tasks' dev scores"


# ------------------------------------------------------------------- task sampling

def sampling_exponent(sampling: str, epoch: int, epochs: int) -> float:
    """a in p_i ~ N_i^a. anneal: 1 at epoch 0, 0.2 at the last epoch (1 for a 1-epoch run)."""
    if sampling == "prop":
        return 1.0
    if sampling == "sqrt":
        return 0.5
    if sampling == "anneal":
        return 1.0 - 0.8 * epoch / (epochs - 1) if epochs > 1 else 1.0
    raise ValueError(f"sampling {sampling!r} has no exponent (one of {', '.join(SAMPLING)})")


def task_probabilities(sizes, sampling: str, epoch: int, epochs: int) -> np.ndarray:
    """The chance of each task per batch in this epoch (round-robin: its share, 1/T)."""
    sizes = np.asarray(sizes, dtype=np.float64)
    if sampling == "round-robin":
        return np.full(len(sizes), 1.0 / len(sizes))
    weights = sizes ** sampling_exponent(sampling, epoch, epochs)
    return weights / weights.sum()


def task_schedule(sizes, sampling: str, epoch: int, epochs: int, n_batches: int,
                  seed: int) -> np.ndarray:
    """The task index of each batch of an epoch. Round-robin continues across epochs."""
    if sampling == "round-robin":
        return (epoch * n_batches + np.arange(n_batches)) % len(sizes)
    rng = np.random.default_rng([seed, epoch, 0x7A5C])
    return rng.choice(len(sizes), size=n_batches,
                      p=task_probabilities(sizes, sampling, epoch, epochs))


class BatchStream:
    """Endless batches of one task: pass after pass over its rows, each pass freshly shuffled
    (length-grouped like single-task training); pass k is seeded with (seed, task, k)."""

    def __init__(self, lengths: np.ndarray, batch_size: int, seed: int, index: int,
                 group_by_length: bool = True):
        self.lengths, self.batch_size, self.seed, self.index = lengths, batch_size, seed, index
        self.group_by_length, self.passes, self.queue = group_by_length, 0, []

    def next(self) -> list[int]:
        if not self.queue:
            rng = np.random.default_rng([self.seed, self.index, self.passes])
            self.passes += 1
            batches = (length_grouped_batches(self.lengths, self.batch_size, rng)
                       if self.group_by_length
                       else random_batches(len(self.lengths), self.batch_size, rng))
            self.queue = batches[::-1]
        return self.queue.pop()


class TaskMixer:
    """Single-task batches of several tasks, in a sampled task order. `epoch(e)` must be called
    for e = 0, 1, 2 ... in turn (the per-task streams carry over between epochs)."""

    def __init__(self, lengths: list[np.ndarray], batch_size: int, sampling: str, epochs: int,
                 seed: int, steps_per_epoch: int = 0, group_by_length: bool = True):
        if sampling not in SAMPLING:
            raise ValueError(f"sampling {sampling!r}: one of {', '.join(SAMPLING)}")
        self.sizes = [len(x) for x in lengths]
        if not all(self.sizes):
            raise ValueError(f"every task needs training rows, got sizes {self.sizes}")
        self.sampling, self.epochs, self.seed = sampling, epochs, seed
        self.n_batches = steps_per_epoch or math.ceil(sum(self.sizes) / batch_size)
        self.streams = [BatchStream(x, batch_size, seed, i, group_by_length)
                        for i, x in enumerate(lengths)]

    def probabilities(self, epoch: int) -> np.ndarray:
        return task_probabilities(self.sizes, self.sampling, epoch, self.epochs)

    def epoch(self, epoch: int) -> list[tuple[int, list[int]]]:
        order = task_schedule(self.sizes, self.sampling, epoch, self.epochs, self.n_batches,
                              self.seed)
        return [(int(t), self.streams[t].next()) for t in order]


# ------------------------------------------------------------------- the run

def fit_multitask(cfg: RunConfig) -> dict:
    """Train and evaluate one multi-task config (method embert or gated); returns metrics.json's
    content. A config that already finished ok is not rerun."""
    if cfg.method not in MULTITASK_METHODS:
        raise ConfigError(f"parameter 'method': fit_multitask runs {', '.join(MULTITASK_METHODS)}, "
                          f"not {cfg.method!r} (use kit.train.fit)")
    return run_recorded(cfg, _fit_multitask)


def _task_config(cfg: RunConfig, name: str) -> RunConfig:
    """The single-task view of one task of the mix (what load_task_data reads)."""
    return replace(cfg, task=name, method="bert", tasks=())


def _fit_multitask(cfg: RunConfig, run_dir: Path) -> dict:
    from accelerate.utils import set_seed
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    set_seed(cfg.seed)
    accelerator = _accelerator(cfg, ktracking.trackers(ktracking.resolve(cfg.report_to),
                                                       cfg.outputs_dir, cfg.profile, cfg.run_id))
    accelerator.init_trackers(cfg.profile or "runs", config=ktracking.hparams(cfg.to_dict()))
    if accelerator.num_processes > 1:
        raise NotImplementedError("multi-task runs are single-process (one GPU or CPU) for now")
    data = [load_task_data(_task_config(cfg, name)) for name in cfg.tasks]
    tasks = [d.task for d in data]
    names = [t.name for t in tasks]
    backbone, tokenizer = load_backbone(cfg.model)
    spec = MultiTaskSpec(tasks=names, num_labels=[t.num_labels for t in tasks],
                         regression=[t.regression for t in tasks], method=cfg.method,
                         adapter_rank=cfg.adapter_rank)
    model = MultiTaskModel(backbone, spec)
    pad_id = tokenizer.pad_token_id
    train = [encode(tokenizer, d.train, cfg.max_length, t.regression) for d, t in zip(data, tasks)]
    dev = [{name: encode(tokenizer, split, cfg.max_length, t.regression)
            for name, split in d.dev.items()} for d, t in zip(data, tasks)]

    # every parameter joins the optimizer now; stages only switch requires_grad (AdamW skips a
    # parameter without a gradient, so a frozen one is neither moved nor decayed)
    optimizer = torch.optim.AdamW(parameter_groups(model, cfg.lr, cfg.weight_decay,
                                                   cfg.layer_decay, cfg.freeze_layers),
                                  lr=cfg.lr, fused=True)
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    model, optimizer = accelerator.prepare(model, optimizer)
    unwrapped = accelerator.unwrap_model(model)
    schedule = LinearSchedule(optimizer, cfg.warmup_ratio)
    mixer = TaskMixer([x.lengths for x in train], cfg.batch_size, cfg.sampling, cfg.epochs,
                      cfg.seed, cfg.steps_per_epoch, cfg.group_by_length)
    progress = (_resume(model, optimizer, run_dir, load=load_multitask)
                if cfg.save_checkpoints else None) or Progress()
    for epoch in range(progress.epoch + 1):   # replay finished epochs: the streams carry over
        mixer.epoch(epoch)
    lr = schedule.set_progress((progress.epoch + 1) / cfg.epochs)

    def evaluate() -> tuple[dict, dict, dict]:
        per_task, three, results = {}, {}, {}
        for t, task in enumerate(tasks):
            unwrapped.set_task(t)
            results[task.name] = {
                split: (_to_predictions(_predict_logits(model, ex, cfg.eval_batch_size, pad_id,
                                                        accelerator, f"eval {task.name}"),
                                        task.regression), ex.labels)
                for split, ex in dev[t].items()}
            per_task[task.name] = kmetrics.evaluate_splits(task, results[task.name])
            three[task.name] = kmetrics.three_subset_stats(
                task, *results[task.name][task.dev_splits[0]])
        return per_task, three, results

    history, epochs, walls = progress.history, progress.epochs, progress.walls
    best_state = None
    started = time.perf_counter() - progress.elapsed
    for epoch in range(progress.epoch + 1, cfg.epochs):
        t0 = time.perf_counter()
        stage = apply_stage(unwrapped, epoch, cfg.gate_start_epoch, cfg.freeze_qkv_epoch,
                            trainable)
        plan = mixer.epoch(epoch)
        model.train()
        running, running_tasks = [], []
        epoch_losses = [[] for _ in tasks]
        for i, (t, rows) in enumerate(kprogress.bar(
                plan, desc=f"epoch {epoch}/{cfg.epochs - 1} train",
                disable=not accelerator.is_local_main_process)):
            batch = _to_device(collate(train[t], rows, pad_id), accelerator)
            with accelerator.accumulate(model):
                out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            special_mask=batch["special_mask"],
                            token_type_ids=batch.get("token_type_ids"), task=t)
                loss = target_loss(out["logits"], batch["labels"], tasks[t].regression)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                    lr = schedule.set_progress((epoch + (i + 1) / len(plan)) / cfg.epochs)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            running.append(loss.detach())
            running_tasks.append(t)
            progress.step += 1
            progress.trained_examples += len(rows)
            if progress.step % cfg.log_every == 0 or i == len(plan) - 1:
                window = torch.stack(running).float()[:, None]   # one host sync per log
                _check_finite(window, ["loss"], epoch, progress.step)
                values = window[:, 0].tolist()
                per_task = {}
                for task_index, value in zip(running_tasks, values):
                    epoch_losses[task_index].append(value)
                    per_task.setdefault(f"loss_{names[task_index]}", []).append(value)
                history.append({"step": progress.step,
                                "epoch": round(epoch + (i + 1) / len(plan), 4),
                                "wall_s": round(time.perf_counter() - started, 3),
                                "loss": float(np.mean(values)),
                                **{k: float(np.mean(v)) for k, v in per_task.items()}, "lr": lr})
                accelerator.log(ktracking.step_scalars(history[-1]), step=progress.step)
                running, running_tasks = [], []
        epoch_train_s = time.perf_counter() - t0
        walls["train"] += epoch_train_s

        # evaluate every task on its full dev set(s); select on the mean task score
        t0 = time.perf_counter()
        per_task, three, results = evaluate()
        score = float(np.mean([m["score"] for m in per_task.values()]))
        counts = np.bincount([t for t, _ in plan], minlength=len(tasks))
        record = {"epoch": epoch, "dev": {**per_task, "score": score}, "three_subset": three,
                  "train_loss": float(np.mean([v for vs in epoch_losses for v in vs])),
                  "train_loss_per_task": {n: float(np.mean(v)) if v else None
                                          for n, v in zip(names, epoch_losses)},
                  "task_batches": dict(zip(names, counts.tolist())),
                  "sampling_probs": dict(zip(names, mixer.probabilities(epoch).round(4).tolist())),
                  "stage": stage, "wall_s": round(time.perf_counter() - started, 3)}
        epochs.append(record)
        improved = progress.best is None or score > progress.best["dev"]["score"]
        if accelerator.is_local_main_process:
            kprogress.note(f"epoch {epoch}/{cfg.epochs - 1}: mean dev score {score:.4f} ("
                           + ", ".join(f"{n} {m['score']:.4f}" for n, m in per_task.items())
                           + f"){' (best)' if improved else ''}")
        accelerator.log(ktracking.epoch_scalars(
            record, None, sum(len(rows) for _, rows in plan) / epoch_train_s), step=progress.step)
        if improved:
            progress.best = record
            for task in tasks:
                _write_dev_predictions(run_dir, task, data[names.index(task.name)].dev,
                                       results[task.name])
            if cfg.predict_test and not cfg.save_checkpoints:
                best_state = copy.deepcopy(unwrapped.state_dict())
        _write_history(run_dir, history)
        walls["eval"] += time.perf_counter() - t0
        progress.epoch, progress.elapsed = epoch, time.perf_counter() - started
        if cfg.save_checkpoints and accelerator.is_main_process:
            _save_checkpoints(unwrapped, tokenizer, run_dir, improved, progress, optimizer)

    if cfg.predict_test and any(d.test for d in data):
        if cfg.save_checkpoints:
            best_state = load_multitask(run_dir / "checkpoint" / "best")[0].state_dict()
        unwrapped.load_state_dict(best_state)
        for t, (task, d) in enumerate(zip(tasks, data)):
            unwrapped.set_task(t)
            for split_name, split in d.test.items():
                examples = encode(tokenizer, split, cfg.max_length, task.regression)
                preds = _to_predictions(_predict_logits(model, examples, cfg.eval_batch_size,
                                                        pad_id, accelerator), task.regression)
                rows = ["index\tprediction"] + [f"{i}\t{_label_text(task, p)}"
                                                for i, p in zip(split.ids, preds)]
                kio.write_text(run_dir / "predictions" / task.name / f"{split_name}.tsv",
                               "\n".join(rows) + "\n")
    walls["total"] = time.perf_counter() - started
    for tracker in accelerator.trackers:   # not end_training(): that also ends the process group
        tracker.finish()
    best = progress.best
    best_three = best["three_subset"]
    return {"epochs": epochs, "best_epoch": best["epoch"], "best_dev": flat_dev(best["dev"]),
            "per_task": {n: best["dev"][n] for n in names},
            "per_task_three_subset": best_three,
            "best_three_subset": {"mean": float(np.mean([s["mean"] for s in best_three.values()])),
                                  "std": float(np.mean([s["std"] for s in best_three.values()]))},
            "last_dev": flat_dev(epochs[-1]["dev"]), "selection": SELECTION,
            "task_sizes": dict(zip(names, mixer.sizes)), "steps_per_epoch": mixer.n_batches,
            "adapter_rank": unwrapped.spec.adapter_rank if cfg.method == "gated" else None,
            "wall_s": {k: round(v, 3) for k, v in walls.items()},
            "train_examples": progress.trained_examples,
            "train_examples_per_s": round(progress.trained_examples / max(walls["train"], 1e-9),
                                          2),
            "peak_memory_mb": _peak_memory_mb(), "ssa_labels": [],
            "resumed_after_epoch": progress.resumed_after_epoch,
            "device": str(accelerator.device), "mixed_precision": accelerator.mixed_precision}


def flat_dev(dev: dict) -> dict:
    """{"RTE": {"accuracy": ..}, "score": ..} -> {"score": .., "RTE/accuracy": ..}."""
    return {"score": dev["score"], **{f"{task}/{name}": value for task, metrics in dev.items()
                                      if task != "score" for name, value in metrics.items()}}


def _write_dev_predictions(run_dir: Path, task, splits: dict, results: dict) -> None:
    for name, (preds, labels) in results.items():
        rows = ["index\tprediction\tlabel"] + [
            f"{i}\t{_label_text(task, p)}\t{_label_text(task, y)}"
            for i, p, y in zip(splits[name].ids, preds, labels)]
        kio.write_text(run_dir / "predictions" / task.name / f"{name}.tsv", "\n".join(rows) + "\n")


# ------------------------------------------------------------------- what the notebook shows

def per_task_table(metrics: dict) -> pd.DataFrame:
    """One row per task: its official dev metrics at the selected epoch (x1, fractions), the
    task score, three-subset mean/std and its train rows; comparable with single-task runs."""
    rows = []
    for name, values in metrics["per_task"].items():
        official = kmetrics.reported_metrics(get_task(name))
        three = metrics["per_task_three_subset"][name]
        rows.append({"task": name, **{m: values[m] for m in official}, "score": values["score"],
                     "three_subset_mean": three["mean"], "three_subset_std": three["std"],
                     "train_rows": metrics["task_sizes"][name]})
    return pd.DataFrame(rows).set_index("task")


def epoch_table(metrics: dict) -> pd.DataFrame:
    """Per epoch: each task's dev score, the selection score (mean), train loss, stage, batches."""
    rows = []
    for e in metrics["epochs"]:
        scores = {f"{n}": m["score"] for n, m in e["dev"].items() if n != "score"}
        rows.append({"epoch": e["epoch"], **scores, "mean_score": e["dev"]["score"],
                     "train_loss": e["train_loss"], "stage": e["stage"],
                     "batches": " ".join(f"{n}:{c}" for n, c in e["task_batches"].items()),
                     "wall_s": e["wall_s"]})
    return pd.DataFrame(rows).set_index("epoch")
