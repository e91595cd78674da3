"""Task-adaptive masked-LM pretraining (TAPT; ITPT with the dev / test text): the third job of
THE loop (kit.train.loop), beside kit.train.finetune.SingleTask and kit.train.multitask.MultiTask.

    pretrain(RunConfig(task="RTE", method="mlm", adapted_dir="outputs/adapted/rte-minilm"))
    fit(RunConfig(task="RTE", model="outputs/adapted/rte-minilm"))      # then fine-tune it

What it brings to the loop: the task's text (kit.data.pretrain_text), any encoder the kit loads with
a masked-LM head (initialised where the checkpoint has none: `mlm_head_initialised` in
metrics.json), transformers' masking drawn per batch from (seed, epoch, the batch's rows), so a
resumed run is bit-exact, and per epoch the masked-LM loss and perplexity of the held-out dev
text, masked once. Checkpoints, and `adapted_dir`, are plain Hugging Face folders:
AutoModelForMaskedLM loads them, and a fine-tuning run takes one as `model`.
"""
from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch import nn

from kit.data import hub
from kit.train import loop, run_state
from kit.train.job import Epoch, Job
from kit import io as kio
from kit.train import progress as kprogress
from kit.train.accel import process_state
from kit.models.attention_mask import encoder_mask
from kit.models.backbones import TINY, ModelError, load_backbone, model_path
from kit.config.paths import project_path
from kit.config.run_config import RunConfig
from kit.data.pipeline import (IGNORE, Examples, encode, length_grouped_batches, pad_rows,
                               random_batches, sorted_batches)
from kit.data.pretrain_text import load_text
from kit.methods.mlm import Masker, mask_all, padded_offsets, seed_of, word_offsets
from kit.data.token_cache import token_cache_dir

HELDOUT_SEED = 0           # the held-out masks do not follow the run's seed: every run compares
LOGITS_BUDGET = 2 ** 26    # eval: at most this many logits (fp32: 256 MB) per forward


def pretrain(cfg: RunConfig) -> dict:
    """Pretrain one config (method mlm); returns metrics.json's content (kit.runs.run_recorded:
    a finished run is reused unless rerun, a killed one resumes)."""
    return loop.recorded(cfg, Pretrain)


class MaskedLM(nn.Module):
    """An AutoModelForMaskedLM with the `.backbone` kit.train.optim's parameter groups look for
    (layer decay and layer freezing work as in fine-tuning). forward(labels=...) returns the
    logits of the masked positions only, [masked, vocab]: a hook hands the output layer (hidden
    x vocab, the largest matmul of a small encoder) just those rows, as fairseq and ModernBERT's
    sparse prediction do; the layers before it are per-position, so the logits are the same."""

    def __init__(self, lm):
        super().__init__()
        self.lm, self._picked = lm, None
        output = lm.get_output_embeddings()
        if output is not None:
            output.register_forward_pre_hook(self._select)

    @property
    def backbone(self):
        return self.lm.base_model

    def _select(self, module, args):
        if self._picked is not None and args[0].dim() == 3:
            return (args[0].flatten(0, 1).index_select(0, self._picked), *args[1:])
        return None

    def forward(self, masked: torch.Tensor, **inputs) -> torch.Tensor:
        """`masked`: the flat positions (row * length + column) of the masked tokens, found on
        the host (`masked_positions`): gathering by index reads nothing back from the device,
        where a boolean mask's selection would (its count decides the shape)."""
        self._picked = masked
        if inputs.get("attention_mask") is not None:    # 4-D: transformers reads no 2-D one back
            inputs["attention_mask"] = encoder_mask(self.lm.base_model, inputs["attention_mask"])
        try:
            logits = self.lm(**inputs).logits
        finally:
            self._picked = None
        return logits if logits.dim() == 2 else logits.flatten(0, 1).index_select(0, masked)


@contextmanager
def _quiet_loading():
    """transformers' load report as errors only: what it lists (a new head, an unused pooler)
    `load_masked_lm` returns, and the run reports in one line and in metrics.json."""
    from transformers.utils import logging as hf_logging
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)


def load_masked_lm(name: str) -> tuple[MaskedLM, object, list[str]]:
    """(model, tokenizer, names of the head weights initialised here) for any model the kit
    loads: the encoder through kit.models.backbones (every source, its one-line errors), its family's
    masked-LM head from the checkpoint where it has one (hub ids and Hugging Face folders), else
    new (the tiny model, classic checkpoint folders, sentence encoders such as minilm)."""
    from transformers import AutoModelForMaskedLM

    from kit.models.checkpoints import is_classic_checkpoint     # imports transformers' models: lazily
    with _quiet_loading():
        encoder, tokenizer = load_backbone(name)
        source = model_path(name)
        source = None if name == TINY or is_classic_checkpoint(source) else source
        offline = source is not None and not Path(source).exists() and hub.hub_unreachable()
        try:
            if source is None:
                lm, new = AutoModelForMaskedLM.from_config(encoder.config), None
            else:
                lm, info = AutoModelForMaskedLM.from_pretrained(
                    source, output_loading_info=True, local_files_only=bool(offline))
                new = sorted(info["missing_keys"])
        except Exception as err:      # noqa: BLE001 - a family without a masked-LM class
            raise ModelError(f"model {name!r}: no masked-LM model for its family "
                             f"({type(err).__name__}: {str(err).splitlines()[0]})") from None
    # the encoder exactly as kit.models.backbones loaded it (a classic checkpoint's renamed weights)
    lm.base_model.load_state_dict(encoder.state_dict(), strict=False)
    if new is None:
        prefix = f"{lm.base_model_prefix}."
        new = sorted(k for k in lm.state_dict() if not k.startswith(prefix))
    # masked-LM classes drop the encoder's pooler (BERT's dense + tanh on [CLS]), which the
    # kit's sentence head starts from: keep the original one, frozen (MLM does not train it),
    # so fine-tuning the adapted folder differs from fine-tuning the original by pretraining only
    pooler = getattr(encoder, "pooler", None)
    if pooler is not None and getattr(lm.base_model, "pooler", False) is None:
        lm.base_model.pooler = pooler.requires_grad_(False)
    return MaskedLM(lm.train()), tokenizer, new


def masked_positions(labels: torch.Tensor) -> torch.Tensor:
    """The flat positions of a HOST batch's masked tokens (labels not IGNORE), int64."""
    return (labels.flatten() != IGNORE).nonzero().squeeze(1)


def masked_loss(logits: torch.Tensor, labels: torch.Tensor,
                masked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed cross-entropy in fp32, count) over the masked positions `masked`: `logits` are
    theirs (MaskedLM), `labels` the whole batch's. The count is the index's length: known on
    the host, no read."""
    target = labels.flatten().index_select(0, masked)
    total = nn.functional.cross_entropy(logits.float(), target, reduction="sum")
    return total, torch.tensor(float(len(masked)), device=logits.device)


class Pretrain(Job):
    """Masked-LM training on a task's text; dev metrics {mlm_loss, perplexity, score=-mlm_loss}
    of the held-out text; `adapted_dir` gets the best epoch's model after training."""
    # a row of weight 0 would be masked and weighed like any other: lengths are bucketed, rows
    # not. Masking happens on the host (on_host), so only these go to the device
    pads_rows = False
    inputs = ("input_ids", "attention_mask", "labels", "masked", "token_type_ids")

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        text = load_text(cfg)
        self.tasks, self.rows = [text.task], text.rows()
        self.model, self.tokenizer, self.new_weights = load_masked_lm(cfg.model)
        self.pad_id = self.tokenizer.pad_token_id
        self.has_test = bool(cfg.adapted_dir)   # the loop's last step: the best weights, loaded
        self.masker = Masker(self.tokenizer, cfg.mlm_probability, cfg.whole_word_mask)
        self.train, self.train_offsets = self._encode(text.train)
        heldout, offsets = self._encode(text.heldout)
        self.heldout = (heldout, *mask_all(self.masker, heldout.input_ids, heldout.special,
                                           offsets, self.pad_id, HELDOUT_SEED))
        self.epoch_index = 0
        _quiet_tied_weights()
        if self.new_weights and process_state().is_local_main_process:
            kprogress.note(f"{cfg.model}: no masked-LM head in the checkpoint; "
                           f"{len(self.new_weights)} head weights initialised")

    def _encode(self, splits) -> tuple[Examples, list[np.ndarray] | None]:
        cfg, cache = self.cfg, token_cache_dir(self.cfg.outputs_dir)
        parts = [encode(self.tokenizer, s, cfg.max_length, self.tasks[0].regression, cache)
                 for s in splits]
        offsets = None
        if cfg.whole_word_mask:
            offsets = [o for s, p in zip(splits, parts)
                       for o in word_offsets(self.tokenizer, s, cfg.max_length, p.input_ids)]
        return Examples.concat(parts), offsets

    def begin(self, epoch: int, unwrapped) -> None:
        self.epoch_index = epoch                 # masks of this epoch's batches follow it

    def epoch(self, epoch: int, probe, unwrapped) -> Epoch:
        cfg = self.cfg
        rng = np.random.default_rng([cfg.seed, epoch])
        batches = (length_grouped_batches(self.train.lengths, cfg.batch_size, rng)
                   if cfg.group_by_length else random_batches(len(self.train), cfg.batch_size, rng))
        return Epoch([self.train], [(0, rows) for rows in batches])

    def on_host(self, batch: dict, task: int) -> dict:
        """Masked on the host before the copy (transformers' collator), seeded by (seed, epoch,
        rows): a batch's rows are its own on every rank and in every run, resumed or not; the
        step reads nothing back. Offsets are padded to the ids' length (a length bucket's)."""
        rows = batch["rows"].tolist()
        ids, labels = self.masker(batch["input_ids"], batch["special_mask"],
                                  padded_offsets(self.train_offsets, rows,
                                                 batch["input_ids"].shape[1]),
                                  seed_of(self.cfg.seed, self.epoch_index, *rows))
        return {**batch, "input_ids": ids, "labels": labels, "masked": masked_positions(labels)}

    def loss_terms(self, model, batch: dict, task: int) -> dict[str, torch.Tensor]:
        logits = model(masked=batch["masked"], input_ids=batch["input_ids"],
                       attention_mask=batch["attention_mask"],
                       token_type_ids=batch.get("token_type_ids"))
        total, count = masked_loss(logits, batch["labels"], batch["masked"])
        return {"loss": total / count.clamp(min=1)}   # a batch with no mask: loss 0, no NaN

    def evaluate(self, predict, unwrapped) -> tuple[dict, dict, dict]:
        loss = heldout_loss(unwrapped, *self.heldout, self.pad_id, self.cfg.eval_batch_size,
                            self.stop)
        return {"mlm_loss": loss, "perplexity": math.exp(min(loss, 700.0)), "score": -loss}, {}, {}

    def record(self, epoch: int, work: Epoch, history: list, epoch_losses: list) -> dict:
        # the mean of the epoch's logging windows: masking makes single windows noisy
        return {"train_loss": float(np.mean(epoch_losses[0]))}

    def write_dev(self, run_dir: Path, results: dict, suffix: str = "") -> None:
        """No predictions: the per-epoch losses are in metrics.json."""

    def write_test(self, run_dir: Path, predict, unwrapped) -> None:
        """Called with the best epoch's weights loaded: write them to `adapted_dir`, whole."""
        if self.writer:
            with kio.atomic_dir(project_path(self.cfg.adapted_dir)) as tmp:
                self.save(unwrapped, self.tokenizer, tmp)

    def save(self, model, tokenizer, folder: Path) -> None:
        model.lm.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    def load(self, folder: Path):
        return load_masked_lm(str(folder))[:2]

    def summary(self, progress: run_state.Progress, unwrapped) -> dict:
        return {"best_dev": progress.best["dev"], "last_dev": progress.epochs[-1]["dev"],
                "mlm_head_initialised": bool(self.new_weights),
                "mlm_head_new_weights": self.new_weights, **self.rows,
                "heldout_masked_tokens": int(sum((x != IGNORE).sum() for x in self.heldout[2])),
                "adapted_dir": str(project_path(self.cfg.adapted_dir))
                if self.cfg.adapted_dir else None}


class _TiedWeightsNote(logging.Filter):
    """accelerate's save_state warns that it stores tied weights (the output layer is the
    input embeddings) once per checkpoint; resuming restores the tie (tests/test_pretrain.py
    resumes a killed run bit for bit), so the line is noise in a run's progress."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Removed shared tensor" not in record.getMessage()


def _quiet_tied_weights() -> None:
    logger = logging.getLogger("accelerate.utils.other")
    if not any(isinstance(f, _TiedWeightsNote) for f in logger.filters):
        logger.addFilter(_TiedWeightsNote())


@torch.inference_mode()
def heldout_loss(model, examples: Examples, masked: list[np.ndarray], labels: list[np.ndarray],
                 pad_id: int, batch_size: int, stop=None) -> float:
    """Mean masked-LM loss over every masked token of the held-out text, in eval mode. With
    several processes each rank runs its slice of every batch and the sums are added up; the
    unwrapped model runs it (no DDP collectives), so ranks may run different numbers of
    forwards. `stop`: a signal ends the pass between two batches (preemption.Interrupted)."""
    from accelerate.utils import reduce
    state, was_training = process_state(), model.training
    model.eval()
    device = next(model.parameters()).device
    sums = torch.zeros(2, dtype=torch.float64)
    vocab = model.lm.config.vocab_size
    bar = kprogress.bar(sorted_batches(examples.lengths, batch_size), desc="eval",
                        disable=not state.is_local_main_process)
    # as step.predict_logits: a stop (preemption.Interrupted) or any error inside the pass leaves
    # the model in the mode it came in (a run that goes on trains with dropout) and the bar closed
    try:
        for idx in bar:
            if stop is not None:           # every rank has the same batches (not the same chunks)
                stop.between_batches(state)
            for rows in _chunks(idx[state.process_index::state.num_processes], labels, vocab):
                sums += _masked_sums(model, examples, masked, labels, rows, pad_id, device)
    finally:
        bar.close()
        model.train(was_training)
    if state.num_processes > 1:
        sums = reduce(sums.to(device), reduction="sum").cpu()
    return float(sums[0] / sums[1].clamp(min=1))


def _masked_sums(model, examples: Examples, masked: list[np.ndarray], labels: list[np.ndarray],
                 rows: list[int], pad_id: int, device) -> torch.Tensor:
    """[summed loss, masked tokens] of one forward over `rows`, on the host (float64)."""
    ids = [masked[i] for i in rows]
    inputs = {"input_ids": pad_rows(ids, pad_id, np.int64),
              "attention_mask": pad_rows([np.ones(len(x), np.int64) for x in ids], 0),
              "labels": pad_rows([labels[i] for i in rows], IGNORE, np.int64)}
    if examples.token_type_ids is not None:
        inputs["token_type_ids"] = pad_rows([examples.token_type_ids[i] for i in rows], 0)
    inputs = {k: torch.from_numpy(v) for k, v in inputs.items()}
    inputs["masked"] = masked_positions(inputs["labels"])
    inputs = {k: v.to(device) for k, v in inputs.items()}
    labels = inputs.pop("labels")
    total, count = masked_loss(model(**inputs), labels, inputs["masked"])
    return torch.stack([total.double().cpu(), count.double().cpu()])


def _chunks(rows: list[int], labels: list[np.ndarray], vocab: int) -> list[list[int]]:
    """`rows` cut so that each forward holds at most LOGITS_BUDGET logits (masked positions x
    vocabulary): a large eval batch of long rows stays within memory."""
    chunks, size = [[]], 0
    for i in rows:
        n = int((labels[i] != IGNORE).sum()) * vocab
        if chunks[-1] and size + n > LOGITS_BUDGET:
            chunks.append([])
            size = 0
        chunks[-1].append(i)
        size += n
    return [c for c in chunks if c]
