"""fit(config): one fine-tuning run, start to finish; and the single-task job of the loop.

    fit(RunConfig(task="RTE", method="ssa-h"))
    python -m kit.train.finetune CONFIG.json   # one run; under torchrun / accelerate launch too

The loop (kit.train.loop) is shared with multi-task runs; what a single-task run brings is here: its
data and model, the epoch's examples of its method (kit.methods.epochs.build_epoch: SSA probing,
BERT-mask copies), its loss terms, its evaluation and prediction files. Outputs: kit.runs.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from kit.train import loop, run_state
from kit.train.job import Epoch, Job, encode_task, note_truncation
from kit.train.step import to_predictions
from kit import methods, runs
from kit.train import metrics as kmetrics
from kit.models.backbones import load_backbone
from kit.config.run_config import MULTITASK_METHODS, ConfigError, RunConfig
from kit.data.csv_data import write_csv_submission
from kit.data.pipeline import encode, length_grouped_batches, load_task_data, random_batches
from kit.config.rules import guided
from kit.methods.guiding import guiding_loss
from kit.methods.bert import HeadSpec, SequenceModel, load_trained, target_loss
from kit.methods.ssa_heads import ssa_loss
from kit.train.multitask import MultiTask
from kit.train.pretrain import Pretrain
from kit.models.regional_compile import planned_steps
from kit.runs import RunPreempted
from kit.train.preemption import PREEMPTED_EXIT
from kit.methods.ssa import SSASettings
from kit.methods.epochs import build_epoch
from kit.data.token_cache import token_cache_dir


def fit(cfg: RunConfig) -> dict:
    """Train and evaluate one config; returns metrics.json's content (see kit.runs.run_recorded).
    The job follows the method: multi-task, masked-LM pretraining (kit.train.pretrain) or single-task."""
    job = (MultiTask if cfg.method in MULTITASK_METHODS
           else Pretrain if methods.get(cfg.method).pretrain else SingleTask)
    return loop.recorded(cfg, job)


class SingleTask(Job):
    """One task, any single-task method: the epoch's examples come from
    kit.methods.epochs.build_epoch."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.data = load_task_data(cfg)
        task = self.data.task
        self.tasks = [task]
        backbone, self.tokenizer = load_backbone(cfg.model,
                                                 eager_attention=guided(cfg.guide_loss))
        self.model = single_task_model(cfg, backbone, task.num_labels,
                                       None if task.regression else list(task.labels))
        self.pad_id = self.tokenizer.pad_token_id
        # what its steps read: the special-token mask only for SSA-H's token mix, token types
        # where the encoder takes them (kit.methods.bert.takes_token_types)
        self.inputs = ("input_ids", "attention_mask", "labels", "ssa_labels",
                       *(("token_type_ids",) if self.model.token_types else ()),
                       *(("special_mask",) if methods.get(cfg.method).hybrid else ()))
        self.train, self.dev, cuts = encode_task(self.tokenizer, self.data, cfg.max_length,
                                                 token_cache_dir(cfg.outputs_dir))
        self.truncation = note_truncation(cuts, cfg.max_length)
        self.has_test = bool(self.data.test)
        self.ssa = SSASettings.from_config(cfg)
        self.planned_steps = planned_steps(cfg.epochs, len(self.train), cfg.batch_size,
                                           cfg.grad_accum)

    def epoch(self, epoch: int, probe, unwrapped) -> Epoch:
        cfg, task = self.cfg, self.tasks[0]
        epoch_set, stats = build_epoch(self.train, self.ssa, epoch,
                                       lambda ex: to_predictions(probe(ex), task.regression),
                                       task.regression, self.tokenizer.mask_token_id,
                                       runs.run_dir_of(cfg) if self.writer else None)
        rng = np.random.default_rng([cfg.seed, epoch])
        batches = (length_grouped_batches(epoch_set.lengths, cfg.batch_size, rng)
                   if cfg.group_by_length else random_batches(len(epoch_set), cfg.batch_size, rng))
        return Epoch([epoch_set], [(0, rows) for rows in batches], stats)

    def loss_terms(self, model, batch: dict, task: int) -> dict[str, torch.Tensor]:
        return run_loss(self.cfg, model, batch, self.tasks[0].regression)

    def evaluate(self, predict, unwrapped) -> tuple[dict, dict, dict]:
        task = self.tasks[0]
        results = {name: (to_predictions(predict(ex), task.regression), ex.labels)
                   for name, ex in self.dev.items()}
        return (kmetrics.evaluate_splits(task, results),
                kmetrics.three_subset_stats(task, *results[task.dev_splits[0]]), results)

    def record(self, epoch: int, work: Epoch, history: list, epoch_losses: list) -> dict:
        return {"train_loss": history[-1]["loss"]}

    def write_dev(self, run_dir: Path, results: dict, suffix: str = "") -> None:
        runs.write_dev_predictions(runs.predictions_dir(run_dir), self.tasks[0], self.data.dev,
                                   results, suffix)

    def write_test(self, run_dir: Path, predict, unwrapped) -> None:
        cfg, task = self.cfg, self.tasks[0]
        for name, split in self.data.test.items():
            preds = to_predictions(
                predict(encode(self.tokenizer, split, cfg.max_length, task.regression,
                               token_cache_dir(cfg.outputs_dir))),
                task.regression)
            if not self.writer:
                continue
            runs.write_test_predictions(runs.predictions_dir(run_dir), task, name, split, preds)
            if task.kind == "csv":     # Kaggle: `<id>,<target>`, class names or floats
                write_csv_submission(run_dir / "submission.csv", split.ids,
                                     [runs.label_text(task, p) for p in preds],
                                     cfg.csv_id_column, cfg.csv_target)

    def load(self, folder: Path):
        return load_trained(folder)

    def summary(self, progress: run_state.Progress, unwrapped) -> dict:
        best = progress.best
        return {"best_dev": best["dev"], "best_three_subset": best["three_subset"],
                "last_dev": progress.epochs[-1]["dev"], "data_source": self.data.train.source,
                "truncation": self.truncation}


def single_task_model(cfg: RunConfig, backbone, num_labels: int,
                      labels: list[str] | None = None) -> SequenceModel:
    """The model a single-task run trains: `backbone` (loaded with eager attention where the
    loss reads its maps: kit.config.rules.guided) and the heads of its method's registry row
    (kit.methods.bert: SSA's token head, SSA-H's token mix). The plan's probe builds it too."""
    return SequenceModel(backbone, HeadSpec(
        num_labels=num_labels, method=cfg.method, beta=cfg.beta,
        hybrid_weighting=cfg.hybrid_weighting, attention_threshold=cfg.attention_threshold,
        share_weight=cfg.share_weight, max_length=cfg.max_length, labels=labels))


def run_loss(cfg: RunConfig, model, batch: dict, regression: bool) -> dict[str, torch.Tensor]:
    """A single-task run's loss terms with its config's weights (`loss_terms`)."""
    return loss_terms(model, batch, regression, cfg.alpha, guide_loss=cfg.guide_loss,
                      pd_factor=cfg.pd_factor, ad_factor=cfg.ad_factor,
                      guide_reduction=cfg.guide_reduction)


def loss_terms(model, batch: dict, regression: bool, alpha: float, *, guide_loss: str = "task",
               pd_factor: float = 0.001, ad_factor: float = 0.001,
               guide_reduction: str = "query") -> dict[str, torch.Tensor]:
    """The training loss and its parts (for history.csv). SSA: alpha * L_target +
    (1 - alpha) * L_SSA; attention guiding (kit.methods.guiding, `guide_loss` other than "task")
    adds pd_factor * L_PD + ad_factor * L_MD on top."""
    maps = guided(guide_loss)
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                special_mask=batch.get("special_mask"), token_type_ids=batch.get("token_type_ids"),
                output_attentions=maps)
    l_target = target_loss(out["logits"], batch["labels"], regression, batch.get("weight"))
    terms = {"loss": l_target}
    if out["token_logits"] is not None:
        l_ssa = ssa_loss(out["token_logits"], batch["ssa_labels"]) if "ssa_labels" in batch \
            else out["token_logits"].sum() * 0.0
        terms = {"loss": alpha * l_target + (1 - alpha) * l_ssa,
                 "loss_target": l_target, "loss_ssa": l_ssa}
    if maps:
        aux, parts = guiding_loss(out["attentions"], batch["attention_mask"], guide_loss,
                                  pd_factor, ad_factor, guide_reduction,
                                  weight=batch.get("weight"))
        terms = {**terms, "loss": terms["loss"] + aux, "loss_target": l_target,
                 **{f"loss_{k}": v for k, v in parts.items()}}
    return terms


def main(argv: list[str] | None = None) -> int:
    """One run from a config file: what `kit.batch --processes N` launches under torchrun."""
    parser = argparse.ArgumentParser(prog="python -m kit.train.finetune", description=main.__doc__)
    parser.add_argument("config", help="a JSON file of RunConfig fields (e.g. a run's config.json)")
    args = parser.parse_args(argv)
    try:
        cfg = RunConfig.from_dict(json.loads(Path(args.config).read_text()))
    except (OSError, ValueError, ConfigError) as err:
        print(f"error: {args.config}: {err}", file=sys.stderr)
        return 2
    try:
        return 0 if fit(cfg).get("status") == "ok" else 1
    except RunPreempted as err:   # recorded as preempted: a job script requeues on this status
        print(f"error: RunPreempted: {err}", file=sys.stderr)
        return PREEMPTED_EXIT
    except Exception as err:      # recorded in metrics.json with its traceback; one line here
        print(f"error: {type(err).__name__}: {err}".splitlines()[0], file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
