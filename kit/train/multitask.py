"""Multi-task training: EmBERT (task-embedded attention) and Gated-BERT on a mix of tasks.

    fit_multitask(RunConfig(task="multitask", tasks=("RTE", "CoLA", "STS-B"), method="embert"))

The schedule (EmBERT / Bert-n-Pals): an epoch is a fixed number of single-task batches
(`steps_per_epoch`, default: all tasks' train rows / batch size); the task of each batch is drawn
with p_i proportional to N_i^a, N_i the task's train rows:
    prop a = 1, sqrt a = 0.5, anneal a = 1 - 0.8 * e / (E - 1) (epoch e of E: proportional at
    the start, nearly uniform at the end), round-robin: tasks in turn.
Each task's batches come from its own endless stream of length-grouped passes over its rows.

Evaluation after every epoch: every task on its full dev set(s) with its official metric. Model
selection: the epoch with the highest MEAN of the task scores (kit.train.metrics.task_score; the
GLUE average; the released code picks on the sum, which selects the same epoch).

Output (the kit.runs contract, outputs/runs/<run_id>/): config.json, metrics.json (status
ok/failed), history.csv (loss and per-task loss per logging window), predictions/<TASK>/<split>.tsv,
checkpoint/{best,last} (kit.models.model_io.save_model's layout; reload with load_multitask;
`last` also holds the loop state, so a killed run resumes after its last finished epoch).
metrics.json:
  epochs[i]["dev"]   = {task: metrics, ..., "score": mean task score}
  best_dev           = {"score": ..., "<TASK>/<metric>": ...}  (flat, so report tables read it)
  per_task           = {task: best-epoch dev metrics}, comparable with a single-task run's best_dev
"""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from kit.train import loop, run_state
from kit.train.job import Epoch, Job, encode_task, note_truncation
from kit.train.step import to_predictions
from kit import methods, runs
from kit.train import metrics as kmetrics
from kit.models.backbones import load_backbone
from kit.config.run_config import MULTITASK_METHODS, ConfigError, RunConfig
from kit.data.pipeline import encode, length_grouped_batches, load_task_data, random_batches
from kit.methods.bert import target_loss
from kit.methods.embert import MultiTaskModel, MultiTaskSpec, apply_stage, load_multitask
from kit.data.token_cache import token_cache_dir

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
    content. A config that already finished ok is reused unless rerun."""
    if cfg.method not in MULTITASK_METHODS:
        raise ConfigError(f"parameter 'method': fit_multitask runs {', '.join(MULTITASK_METHODS)}, "
                          f"not {cfg.method!r} (use kit.train.finetune.fit)")
    return loop.recorded(cfg, MultiTask)


def _task_config(cfg: RunConfig, name: str) -> RunConfig:
    """The single-task view of one task of the mix (what load_task_data reads)."""
    return replace(cfg, task=name, method="bert", tasks=())


class MultiTask(Job):
    """Several tasks, one head each (EmBERT / Gated-BERT); batches of one task at a time, the
    task of each batch sampled by TaskMixer; gated stages switch per epoch."""
    find_unused_parameters = True
    inputs = ("input_ids", "attention_mask", "labels", "token_type_ids")   # no SSA, no token mix

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.data = [load_task_data(_task_config(cfg, name)) for name in cfg.tasks]
        self.tasks = [d.task for d in self.data]
        self.names = [t.name for t in self.tasks]
        backbone, self.tokenizer = load_backbone(cfg.model)
        spec = MultiTaskSpec(tasks=self.names, num_labels=[t.num_labels for t in self.tasks],
                             regression=[t.regression for t in self.tasks], method=cfg.method,
                             adapter_rank=cfg.adapter_rank)
        self.model = MultiTaskModel(backbone, spec)
        self.pad_id = self.tokenizer.pad_token_id
        parts = [encode_task(self.tokenizer, d, cfg.max_length, token_cache_dir(cfg.outputs_dir))
                 for d in self.data]
        self.train, self.dev = [p[0] for p in parts], [p[1] for p in parts]
        cuts = {f"{name} {split}": cut for name, p in zip(self.names, parts)
                for split, cut in p[2].items()}
        self.truncation = note_truncation(cuts, cfg.max_length)
        self.has_test = cfg.predict_test and any(d.test for d in self.data)
        self.mixer = TaskMixer([x.lengths for x in self.train], cfg.batch_size, cfg.sampling,
                               cfg.epochs, cfg.seed, cfg.steps_per_epoch, cfg.group_by_length)
        self.stage = None

    def resumed(self, epoch: int) -> None:
        for e in range(epoch + 1):      # replay finished epochs: the streams carry over
            self.mixer.epoch(e)

    def begin(self, epoch: int, unwrapped) -> None:
        # every parameter joined the optimizer; stages only switch requires_grad (AdamW skips a
        # parameter without a gradient, so a frozen one is neither moved nor decayed)
        self.stage = apply_stage(unwrapped, epoch, self.cfg.gate_start_epoch,
                                 self.cfg.freeze_qkv_epoch, self.trainable)

    def epoch(self, epoch: int, probe, unwrapped) -> Epoch:
        return Epoch(self.train, self.mixer.epoch(epoch))

    def loss_terms(self, model, batch: dict, task: int) -> dict:
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch.get("token_type_ids"), task=task)
        return {"loss": target_loss(out["logits"], batch["labels"], self.tasks[task].regression,
                                    batch.get("weight"))}

    def evaluate(self, predict, unwrapped) -> tuple[dict, dict, dict]:
        """Every task on its full dev set(s); selection on the mean task score."""
        per_task, three, results = {}, {}, {}
        for t, task in enumerate(self.tasks):
            unwrapped.set_task(t)
            results[task.name] = {
                split: (to_predictions(predict(ex, f"eval {task.name}"), task.regression),
                        ex.labels) for split, ex in self.dev[t].items()}
            per_task[task.name] = kmetrics.evaluate_splits(task, results[task.name])
            three[task.name] = kmetrics.three_subset_stats(
                task, *results[task.name][task.dev_splits[0]])
        score = float(np.mean([m["score"] for m in per_task.values()]))
        return {**per_task, "score": score}, three, results

    def record(self, epoch: int, work: Epoch, history: list, epoch_losses: list) -> dict:
        counts = np.bincount([t for t, _ in work.plan], minlength=len(self.tasks))
        return {"train_loss": float(np.mean([v for vs in epoch_losses for v in vs])),
                "train_loss_per_task": {n: float(np.mean(v)) if v else None
                                        for n, v in zip(self.names, epoch_losses)},
                "task_batches": dict(zip(self.names, counts.tolist())),
                "sampling_probs": dict(zip(self.names,
                                           self.mixer.probabilities(epoch).round(4).tolist())),
                "stage": self.stage}

    def write_dev(self, run_dir: Path, results: dict, suffix: str = "") -> None:
        for task, d in zip(self.tasks, self.data):
            runs.write_dev_predictions(runs.predictions_dir(run_dir, task.name), task, d.dev,
                                       results[task.name], suffix)

    def write_test(self, run_dir: Path, predict, unwrapped) -> None:
        for t, (task, d) in enumerate(zip(self.tasks, self.data)):
            unwrapped.set_task(t)
            for name, split in d.test.items():
                examples = encode(self.tokenizer, split, self.cfg.max_length, task.regression,
                                  token_cache_dir(self.cfg.outputs_dir))
                preds = to_predictions(predict(examples), task.regression)
                if self.writer:
                    runs.write_test_predictions(runs.predictions_dir(run_dir, task.name), task,
                                                name, split, preds)

    def load(self, folder: Path):
        return load_multitask(folder)

    def summary(self, progress: run_state.Progress, unwrapped) -> dict:
        best, last = progress.best, progress.epochs[-1]
        best_three = best["three_subset"]
        return {"best_dev": flat_dev(best["dev"]),
                "per_task": {n: best["dev"][n] for n in self.names},
                "per_task_three_subset": best_three,
                "best_three_subset": {
                    "mean": float(np.mean([s["mean"] for s in best_three.values()])),
                    "std": float(np.mean([s["std"] for s in best_three.values()]))},
                "last_dev": flat_dev(last["dev"]), "selection": SELECTION,
                "truncation": self.truncation,
                "task_sizes": dict(zip(self.names, self.mixer.sizes)),
                "steps_per_epoch": self.mixer.n_batches,
                "adapter_rank": (unwrapped.spec.adapter_rank
                                 if methods.get(self.cfg.method).gated else None)}


def flat_dev(dev: dict) -> dict:
    """{"RTE": {"accuracy": ..}, "score": ..} -> {"score": .., "RTE/accuracy": ..}."""
    return {"score": dev["score"], **kmetrics.flatten_metrics(dev)}
