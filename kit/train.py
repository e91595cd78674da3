"""fit(config): one fine-tuning run, start to finish, on accelerate.

Read top to bottom: set-up, then per epoch (1) build the epoch's examples (SSA probing happens
here, with the model from the previous epoch), (2) train, (3) evaluate on the full dev set and
checkpoint. Everything a run produces lands in outputs/runs/<run_id>/ (see docs/design.md).
"""
from __future__ import annotations

import copy
import csv
import io
import json
import random
import resource
import shutil
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from kit import io as kio
from kit import metrics as kmetrics
from kit import progress as kprogress
from kit import tracking as ktracking
from kit.config import MULTITASK_METHODS, RunConfig
from kit.data import (Examples, encode, length_grouped_batches, load_task_data, make_loader,
                      random_batches, sorted_batches)
from kit.guiding import guiding_loss
from kit.models import (HeadSpec, SequenceModel, load_backbone, load_trained, save_model, ssa_loss,
                        target_loss)
from kit.optim import parameter_groups
from kit.ssa import build_epoch
from kit.submission import write_csv_submission


class NonFiniteLoss(RuntimeError):
    pass


def run_dir_of(cfg: RunConfig) -> Path:
    return Path(cfg.outputs_dir) / "runs" / cfg.run_id


def finished_metrics(cfg: RunConfig) -> dict | None:
    """The metrics of an earlier run of this exact config that ended ok, if any."""
    path = run_dir_of(cfg) / "metrics.json"
    if path.exists():
        done = json.loads(path.read_text())
        if done.get("status") == "ok":
            return done
    return None


class RunLocked(RuntimeError):
    pass


def fit(cfg: RunConfig) -> dict:
    """Train and evaluate one config; returns metrics.json's content (see run_recorded)."""
    if cfg.method in MULTITASK_METHODS:
        from kit.multitask import fit_multitask   # lazy: kit.multitask imports kit.train
        return fit_multitask(cfg)
    return run_recorded(cfg, _fit)


def run_recorded(cfg: RunConfig, body) -> dict:
    """The frame of every run: a config that already finished ok is not rerun (its results are
    never overwritten); one process trains a run at a time (RunLocked otherwise); config.json
    first, then metrics.json with status ok, or failed and the error. `body(cfg, run_dir)`
    trains and returns the metrics; a run killed earlier resumes inside it."""
    done = finished_metrics(cfg)
    if done is not None:
        return done
    run_dir = run_dir_of(cfg)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise kio.OutputsError(f"cannot write to outputs folder {cfg.outputs_dir!r} "
                               f"({err.strerror}); set outputs_dir to a writable folder") from None
    with kio.FileLock(run_dir / ".lock") as locked:
        if not locked:
            raise RunLocked(f"{run_dir} is being trained by another process")
        done = finished_metrics(cfg)       # it may have finished while we waited for the lock
        if done is not None:
            return done
        kio.write_json(run_dir / "config.json", cfg.to_dict())
        base = {"run_id": cfg.run_id, "task": cfg.task, "model": cfg.model,
                "method": cfg.method, "seed": cfg.seed, "profile": cfg.profile,
                **({"tasks": list(cfg.tasks)} if cfg.tasks else {})}
        try:
            result = body(cfg, run_dir)
        except BaseException as err:   # KeyboardInterrupt too: a stopped run must say so
            kio.write_json(run_dir / "metrics.json", {
                **base, "status": "failed", "error": f"{type(err).__name__}: {err}".splitlines()[0],
                "traceback": traceback.format_exc()[-4000:]})
            raise
        metrics = {**base, "status": "ok", "error": None, **result}
        kio.write_json(run_dir / "metrics.json", metrics)
        return metrics


# CPU features with bf16 matrix instructions (torch.cpu.get_capabilities() names): there a bf16
# matmul runs ~2.3x the fp32 one (docs/benchmarks.md); elsewhere bf16 is emulated, slower than fp32.
# ARM's bf16 is left at fp32: not measured.
NATIVE_BF16_FEATURES = ("avx512_bf16", "amx_bf16")


def cpu_has_native_bf16() -> bool:
    return any(torch.cpu.get_capabilities().get(f, False) for f in NATIVE_BF16_FEATURES)


def resolve_precision(requested: str, cuda: bool, cuda_bf16: bool, cpu_bf16: bool) -> str:
    """What `mixed_precision: auto` means on this machine: bf16 autocast where the hardware has
    bf16 (GPU: else fp16), fp32 ("no") on a CPU without native bf16. Explicit values stand."""
    if requested != "auto":
        return requested
    if cuda:
        return "bf16" if cuda_bf16 else "fp16"
    return "bf16" if cpu_bf16 else "no"


def _accelerator(cfg: RunConfig, log_with: list | None = None):
    """accelerate with autocast at the resolved precision: prepare() wraps the model's forward, so
    training, probing and evaluation all run in it; weights and optimizer state stay fp32, and
    the forward's outputs come back as fp32 (losses and predictions are fp32)."""
    from accelerate import Accelerator
    cuda = torch.cuda.is_available()
    precision = resolve_precision(cfg.mixed_precision, cuda, cuda and torch.cuda.is_bf16_supported(),
                                  not cuda and cpu_has_native_bf16())
    if cuda and cfg.mixed_precision == "auto":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    _allow_precision_change(precision)
    return Accelerator(mixed_precision=precision, gradient_accumulation_steps=cfg.grad_accum,
                       log_with=log_with or None)


def _allow_precision_change(precision: str) -> None:
    """accelerate keeps one precision per process (its AcceleratorState refuses another until
    reset), so a notebook or test that runs fit in bf16 and then in fp32 would fail. In a single
    process, forget the old precision; the process state (PartialState) is kept. Models prepared
    earlier keep the autocast they were wrapped with."""
    from accelerate.state import AcceleratorState, PartialState
    state = AcceleratorState._shared_state
    single = PartialState._shared_state.get("num_processes", 1) == 1
    if state and single and state.get("_mixed_precision") != precision:
        AcceleratorState._reset_state()


class LinearSchedule:
    """Linear warm-up then linear decay to 0, as a function of training progress in [0, 1].
    Progress (not a step count) because SSA and BERT-mask epochs vary in size."""

    def __init__(self, optimizer, warmup_ratio: float):
        self.optimizer, self.warmup = optimizer, warmup_ratio
        self.base = [g["lr"] for g in optimizer.param_groups]

    def set_progress(self, p: float) -> float:
        factor = p / self.warmup if p < self.warmup else (1 - p) / (1 - self.warmup)
        for group, lr in zip(self.optimizer.param_groups, self.base):
            group["lr"] = lr * max(factor, 0.0)
        return self.optimizer.param_groups[0]["lr"]


def _fit(cfg: RunConfig, run_dir: Path) -> dict:
    from accelerate.utils import set_seed
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()      # per-checkpoint "Writing model shards" bars
    set_seed(cfg.seed)
    accelerator = _accelerator(cfg, ktracking.trackers(ktracking.resolve(cfg.report_to),
                                                       cfg.outputs_dir, cfg.profile, cfg.run_id))
    accelerator.init_trackers(cfg.profile or "runs", config=ktracking.hparams(cfg.to_dict()))
    data = load_task_data(cfg)
    task = data.task
    backbone, tokenizer = load_backbone(cfg.model, eager_attention=cfg.guide_loss != "task")
    spec = HeadSpec(num_labels=task.num_labels, method=cfg.method, beta=cfg.beta,
                    hybrid_weighting=cfg.hybrid_weighting,
                    attention_threshold=cfg.attention_threshold,
                    share_weight=cfg.share_weight, max_length=cfg.max_length,
                    labels=None if task.regression else list(task.labels))
    model = SequenceModel(backbone, spec)
    pad_id = tokenizer.pad_token_id
    train = encode(tokenizer, data.train, cfg.max_length, task.regression)
    dev = {name: encode(tokenizer, split, cfg.max_length, task.regression)
           for name, split in data.dev.items()}

    # fused AdamW: one kernel for all parameters (CPU and CUDA); ~8x faster steps on CPU
    optimizer = torch.optim.AdamW(parameter_groups(model, cfg.lr, cfg.weight_decay,
                                                   cfg.layer_decay, cfg.freeze_layers),
                                  lr=cfg.lr, fused=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    schedule = LinearSchedule(optimizer, cfg.warmup_ratio)

    def predict(examples: Examples, desc: str = "eval") -> np.ndarray:
        return _to_predictions(_predict_logits(model, examples, cfg.eval_batch_size, pad_id,
                                               accelerator, desc), task.regression)

    progress = _resume(model, optimizer, run_dir) if cfg.save_checkpoints else None
    progress = progress or Progress()
    if cfg.compile:     # after resuming: checkpoints hold the plain module's weight names
        model = torch.compile(model, dynamic=True)
    lr = schedule.set_progress((progress.epoch + 1) / cfg.epochs)
    walls = progress.walls
    started = time.perf_counter() - progress.elapsed
    for epoch in range(progress.epoch + 1, cfg.epochs):
        # (1) the epoch's examples: SSA probes with the model as it stands after epoch - 1
        t0 = time.perf_counter()
        epoch_set, stats = build_epoch(train, cfg, epoch,
                                       lambda ex: predict(ex, f"epoch {epoch} label generation"),
                                       task.regression, tokenizer.mask_token_id, run_dir)
        walls["label_generation"] += time.perf_counter() - t0
        if stats is not None:
            progress.label_stats.append(stats)

        # (2) train: dropout on (model.train() every epoch: probing and eval switch it off)
        t0 = time.perf_counter()
        rng = np.random.default_rng([cfg.seed, epoch])
        batches = (length_grouped_batches(epoch_set.lengths, cfg.batch_size, rng)
                   if cfg.group_by_length else random_batches(len(epoch_set), cfg.batch_size, rng))
        loader = _loader(accelerator, epoch_set, batches, pad_id)
        model.train()
        running = []
        steps = kprogress.bar(loader, desc=f"epoch {epoch}/{cfg.epochs - 1} train",
                             disable=not accelerator.is_local_main_process)
        for i, batch in enumerate(steps):
            batch = _to_device(batch, accelerator)
            with accelerator.accumulate(model):
                terms = _loss_terms(model, batch, cfg, task.regression)
                accelerator.backward(terms["loss"])
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                    lr = schedule.set_progress((epoch + (i + 1) / len(loader)) / cfg.epochs)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            running.append(torch.stack([v.detach() for v in terms.values()]))
            progress.step += 1
            progress.trained_examples += len(batch["labels"])
            if progress.step % cfg.log_every == 0 or i == len(loader) - 1:
                window = torch.stack(running).float()       # one host sync per log, not per step
                running = []
                _check_finite(window, list(terms), epoch, progress.step)
                progress.history.append({
                    "step": progress.step, "epoch": round(epoch + (i + 1) / len(loader), 4),
                    "wall_s": round(time.perf_counter() - started, 3),
                    **dict(zip(terms, window.mean(0).tolist())), "lr": lr})
                steps.set_postfix(loss=f"{progress.history[-1]['loss']:.4f}", refresh=False)
                accelerator.log(ktracking.step_scalars(progress.history[-1]), step=progress.step)
        steps.close()
        epoch_train_s = time.perf_counter() - t0
        walls["train"] += epoch_train_s

        # (3) evaluate on the full dev set(s); checkpoint best, then last with the loop state
        t0 = time.perf_counter()
        results = {name: (predict(ex), ex.labels) for name, ex in dev.items()}
        dev_metrics = kmetrics.evaluate_splits(task, results)
        if cfg.save_epoch_predictions:   # the CommonLit recipe: every epoch's eval predictions
            _write_dev_predictions(run_dir, task, data.dev, results, suffix=f"_epoch{epoch}")
        record = {"epoch": epoch, "dev": dev_metrics,
                  "three_subset": kmetrics.three_subset_stats(task, *results[task.dev_splits[0]]),
                  "train_loss": progress.history[-1]["loss"],
                  "wall_s": round(time.perf_counter() - started, 3)}
        progress.epochs.append(record)
        improved = progress.best is None or dev_metrics["score"] > progress.best["dev"]["score"]
        if accelerator.is_local_main_process:
            kprogress.note(f"epoch {epoch}/{cfg.epochs - 1}: dev {_brief(dev_metrics)}, train loss "
                           f"{record['train_loss']:.4f}{' (best)' if improved else ''}")
        accelerator.log(ktracking.epoch_scalars(record, stats, len(epoch_set) / epoch_train_s),
                        step=progress.step)
        unwrapped = accelerator.unwrap_model(model)
        if improved:
            progress.best = record
            _write_dev_predictions(run_dir, task, data.dev, results)
            if data.test and not cfg.save_checkpoints:
                best_in_memory = copy.deepcopy(unwrapped.state_dict())
        _write_history(run_dir, progress.history)
        walls["eval"] += time.perf_counter() - t0
        progress.epoch, progress.elapsed = epoch, time.perf_counter() - started
        if cfg.save_checkpoints and accelerator.is_main_process:
            _save_checkpoints(unwrapped, tokenizer, run_dir, improved, progress, optimizer)

    if data.test:                      # GLUE with predict_test, or a CSV task's csv_test_path
        best_weights = (load_trained(run_dir / "checkpoint" / "best")[0].state_dict()
                        if cfg.save_checkpoints else best_in_memory)
        accelerator.unwrap_model(model).load_state_dict(best_weights)
        for name, split in data.test.items():
            preds = predict(encode(tokenizer, split, cfg.max_length, task.regression))
            _write_test_predictions(run_dir, task, name, split, preds)
            if task.kind == "csv":     # Kaggle: `<id>,<target>`, class names or floats
                write_csv_submission(run_dir / "submission.csv", split.ids,
                                     [_label_text(task, p) for p in preds], cfg.csv_id_column,
                                     cfg.csv_target)
    walls["total"] = time.perf_counter() - started
    for tracker in accelerator.trackers:   # not end_training(): that also ends the process group
        tracker.finish()
    best = progress.best
    return {"epochs": progress.epochs, "best_epoch": best["epoch"], "best_dev": best["dev"],
            "best_three_subset": best["three_subset"], "last_dev": progress.epochs[-1]["dev"],
            "wall_s": {k: round(v, 3) for k, v in walls.items()},
            "train_examples": progress.trained_examples,
            "train_examples_per_s": round(progress.trained_examples / max(walls["train"], 1e-9), 2),
            "peak_memory_mb": _peak_memory_mb(), "ssa_labels": progress.label_stats,
            "resumed_after_epoch": progress.resumed_after_epoch,
            "device": str(accelerator.device), "mixed_precision": accelerator.mixed_precision}


@dataclass
class Progress:
    """What the loop accumulates; saved with the last checkpoint so a killed run resumes."""
    epoch: int = -1                    # last finished epoch
    step: int = 0
    trained_examples: int = 0
    elapsed: float = 0.0
    history: list = field(default_factory=list)
    epochs: list = field(default_factory=list)
    label_stats: list = field(default_factory=list)
    walls: dict = field(default_factory=lambda: {"train": 0.0, "label_generation": 0.0, "eval": 0.0})
    best: dict | None = None
    resumed_after_epoch: int | None = None


STATE_FILE = "trainer_state.pt"


class CheckpointError(RuntimeError):
    pass


def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
            "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def _save_checkpoints(model, tokenizer, run_dir: Path, improved: bool, progress: Progress,
                      optimizer) -> None:
    """After an epoch: `best` when it improved, and always `last` with the loop state (progress,
    optimizer, RNG) that `_resume` reads back."""
    if improved:
        _save_atomic(model, tokenizer, run_dir / "checkpoint" / "best")
    _save_atomic(model, tokenizer, run_dir / "checkpoint" / "last",
                 state={"progress": asdict(progress), "optimizer": optimizer.state_dict(),
                        "rng": _rng_state()})


def _resume(model, optimizer, run_dir: Path, load=load_trained) -> Progress | None:
    """Load the last checkpoint's weights (read with `load`), optimizer, RNG and loop state, if
    there is one. SSA labels need no saving: they are regenerated from the restored model and
    the (seed, epoch)-seeded generator, exactly as the uninterrupted run drew them."""
    last = run_dir / "checkpoint" / "last"
    # a kill between the two renames of _save_atomic leaves only the previous copy, as .old
    folder = next((f for f in (last, last.with_name("last.old")) if (f / STATE_FILE).exists()), None)
    if folder is None:
        return None
    try:
        state = torch.load(folder / STATE_FILE, weights_only=False)
        model.load_state_dict(load(folder)[0].state_dict())
        optimizer.load_state_dict(state["optimizer"])
    except Exception as err:
        raise CheckpointError(f"{folder} is corrupt ({type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}); delete "
                              "that folder to restart the run from scratch") from None
    torch.set_rng_state(state["rng"]["torch"])
    np.random.set_state(state["rng"]["numpy"])
    random.setstate(state["rng"]["python"])
    if state["rng"]["cuda"] is not None:
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    progress = Progress(**state["progress"])
    progress.resumed_after_epoch = progress.epoch
    return progress


def _check_finite(window: torch.Tensor, names: list[str], epoch: int, step: int) -> None:
    """Stop at the first non-finite loss of the logging window, naming its step and terms."""
    bad = (~torch.isfinite(window)).any(dim=1).nonzero()
    if len(bad):
        row = int(bad[0])
        at = step - len(window) + row
        raise NonFiniteLoss(f"non-finite loss at epoch {epoch} step {at}: " + ", ".join(
            f"{k}={v:.4g}" for k, v in zip(names, window[row].tolist())))


def _loader(accelerator, examples: Examples, batches: list[list[int]], pad_id: int):
    """Sharded by accelerate only when there are several processes: prepare() keeps every loader
    it sees (and with it the epoch's examples) alive for the whole run."""
    loader = make_loader(examples, batches, pad_id, pin_memory=accelerator.device.type == "cuda")
    return accelerator.prepare(loader) if accelerator.num_processes > 1 else loader


def _to_device(batch: dict, accelerator) -> dict:
    if accelerator.num_processes > 1:      # prepared loaders already place batches
        return batch
    return {k: v.to(accelerator.device, non_blocking=True) for k, v in batch.items()}


def _loss_terms(model, batch: dict, cfg: RunConfig, regression: bool) -> dict[str, torch.Tensor]:
    """The training loss and its parts (for history.csv). SSA: alpha * L_target +
    (1 - alpha) * L_SSA; attention guiding adds pd_factor * L_PD + ad_factor * L_MD on top."""
    guided = cfg.guide_loss != "task"
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                special_mask=batch["special_mask"], token_type_ids=batch.get("token_type_ids"),
                output_attentions=guided)
    l_target = target_loss(out["logits"], batch["labels"], regression)
    terms = {"loss": l_target}
    if out["token_logits"] is not None:
        l_ssa = ssa_loss(out["token_logits"], batch["ssa_labels"]) if "ssa_labels" in batch \
            else out["token_logits"].sum() * 0.0
        terms = {"loss": cfg.alpha * l_target + (1 - cfg.alpha) * l_ssa,
                 "loss_target": l_target, "loss_ssa": l_ssa}
    if guided:
        aux, parts = guiding_loss(out["attentions"], batch["attention_mask"], cfg.guide_loss,
                                  cfg.pd_factor, cfg.ad_factor, cfg.guide_reduction)
        terms = {**terms, "loss": terms["loss"] + aux, "loss_target": l_target,
                 **{f"loss_{k}": v for k, v in parts.items()}}
    return terms


@torch.inference_mode()
def _predict_logits(model, examples: Examples, batch_size: int, pad_id: int,
                    accelerator, desc: str = "eval") -> np.ndarray:
    """Logits for every row, in row order. Eval mode (no dropout); longest batches first;
    rows travel with the batch so sharded, gathered results can be put back in order."""
    was_training = model.training
    model.eval()
    loader = _loader(accelerator, examples, sorted_batches(examples.lengths, batch_size), pad_id)
    rows, logits = [], []
    for batch in kprogress.bar(loader, desc=desc, disable=not accelerator.is_local_main_process):
        batch = _to_device(batch, accelerator)
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    special_mask=batch["special_mask"], token_type_ids=batch.get("token_type_ids"))
        got_rows, got = accelerator.gather_for_metrics((batch["rows"], out["logits"].float()))
        rows.append(got_rows.cpu())
        logits.append(got.cpu())
    model.train(was_training)
    result = np.empty((len(examples), logits[0].shape[-1]), dtype=np.float32)
    result[torch.cat(rows).numpy()] = torch.cat(logits).numpy()
    return result


def _brief(dev_metrics: dict) -> str:
    """`accuracy 0.6123, f1 0.58` from a dev metrics dict (flat or per dev split)."""
    flat = {k: v for k, v in dev_metrics.items() if isinstance(v, (int, float)) and k != "score"}
    return ", ".join(f"{k} {v:.4f}" for k, v in flat.items()) or f"score {dev_metrics['score']:.4f}"


def _to_predictions(logits: np.ndarray, regression: bool) -> np.ndarray:
    return logits[:, 0] if regression else logits.argmax(-1)


def _save_atomic(model, tokenizer, folder: Path, state: dict | None = None) -> None:
    """Write into a sibling temp folder, then swap it in: a crash never leaves a half checkpoint."""
    tmp = folder.with_name(folder.name + ".tmp")
    old = folder.with_name(folder.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    if folder.exists():                    # else .old may be the only complete copy
        shutil.rmtree(old, ignore_errors=True)
    save_model(model, tokenizer, tmp)
    if state is not None:
        torch.save(state, tmp / STATE_FILE)
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def _write_history(run_dir: Path, history: list[dict]) -> None:
    if not history:
        return
    buf = io.StringIO()
    fields = list(dict.fromkeys(k for row in history for k in row))
    writer = csv.DictWriter(buf, fieldnames=fields)
    writer.writeheader()
    writer.writerows(history)
    kio.write_text(run_dir / "history.csv", buf.getvalue())


def _label_text(task, value) -> str:
    return f"{float(value):.7g}" if task.regression else task.labels[int(value)]


def _write_dev_predictions(run_dir: Path, task, splits: dict, results: dict,
                           suffix: str = "") -> None:
    for name, (preds, labels) in results.items():
        rows = ["index\tprediction\tlabel"] + [
            f"{i}\t{_label_text(task, p)}\t{_label_text(task, y)}"
            for i, p, y in zip(splits[name].ids, preds, labels)]
        kio.write_text(run_dir / "predictions" / f"{name}{suffix}.tsv", "\n".join(rows) + "\n")


def _write_test_predictions(run_dir: Path, task, name: str, split, preds: np.ndarray) -> None:
    """The GLUE server's format: `index<TAB>prediction`, label strings (scores for STS-B)."""
    rows = ["index\tprediction"] + [f"{i}\t{_label_text(task, p)}" for i, p in zip(split.ids, preds)]
    kio.write_text(run_dir / "predictions" / f"{name}.tsv", "\n".join(rows) + "\n")


def _peak_memory_mb() -> float:
    if torch.cuda.is_available():
        return round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # KiB on Linux
