"""The plan's probe (kit.plan): a point's own model, built as its run builds it (its method's
heads, eager attention with maps where a guide loss reads them) with random weights, trained
with its run's loss and evaluated for a few seconds at its shapes on this machine's device - its
s/step, s per evaluation batch, peak memory, checkpoint bytes and write time. The step is the
doctor's (kit.train.speed_probe.stepper: the loop's own train_step)."""
from __future__ import annotations

import tempfile
import time

import torch

from kit import methods
from kit.config.run_config import RunConfig
from kit.config.rules import guided
from kit.train.finetune import run_loss, single_task_model
from kit.train.speed_probe import random_batch, stepper, sync_device, time_steps

# what of a point changes the step the probe times (with its method's family, `step_config`);
# the rest stays at its default, so points that differ elsewhere (seed, lr, epochs, gamma ...)
# share one probe
STEP_FIELDS = ("model", "batch_size", "eval_batch_size", "freeze_layers", "mixed_precision",
               "guide_loss", "guide_reduction", "share_weight", "max_length")


def step_config(cfg: RunConfig) -> RunConfig:
    """The point's step: its STEP_FIELDS, and its method by the model it trains (the registry's
    first method with the same heads: BERT-mask trains BERT's model, SSA-H adds a token mix to
    SSA-Co's)."""
    kind = methods.get(cfg.method)
    family = methods.names(token_head=kind.token_head, hybrid=kind.hybrid,
                           multitask=kind.multitask, pretrain=kind.pretrain)[0]
    return RunConfig.from_dict({**{k: getattr(cfg, k) for k in STEP_FIELDS}, "method": family})


def random_encoder(name: str, eager_attention: bool = False):
    """(encoder, tokenizer) of a model name with random weights, built from its config alone
    (AutoConfig + from_config): timing and memory need the shapes, not the weights, so a hub
    model needs only its config and tokenizer in the local cache. `eager_attention`: as
    kit.models.backbones.load_backbone."""
    from transformers import AutoConfig, AutoModel
    from transformers.utils import logging
    from kit.data.hub import hub_unreachable
    from kit.models.backbones import (TINY, attn_implementation, is_hub_id, load_backbone,
                                      load_tokenizer, model_path)
    logging.disable_progress_bar()
    if name == TINY:
        return load_backbone(TINY, eager_attention)
    offline = is_hub_id(name) and hub_unreachable() is not None
    config = AutoConfig.from_pretrained(model_path(name), local_files_only=offline)
    return (AutoModel.from_config(config, attn_implementation=attn_implementation(eager_attention)),
            load_tokenizer(name, offline))


def build_model(cfg: RunConfig):
    """(model, tokenizer): the point's model as its run builds it
    (kit.train.finetune.single_task_model), on a `random_encoder`."""
    encoder, tokenizer = random_encoder(cfg.model, guided(cfg.guide_loss))
    return single_task_model(cfg, encoder, num_labels=2).train(), tokenizer


class PeakRss:
    """The process's resident memory sampled every few ms in a thread: the peak's growth over
    the RSS at the start (a CPU's "device memory"; ru_maxrss cannot be reset between probes)."""

    def __init__(self, every_s: float = 0.005):
        import threading
        import psutil
        _release_freed()
        self._process, self._every = psutil.Process(), every_s
        self.start = self.peak = self._process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(self._every):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def growth(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, self._process.memory_info().rss) - self.start


def _release_freed() -> None:
    """Freed memory back to the system before a baseline (glibc's malloc_trim): an earlier
    probe's freed blocks stay in the process otherwise, and the next probe grows into them
    unseen. Elsewhere (no glibc) nothing."""
    import ctypes
    import gc
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def state_bytes(state) -> int:
    """Bytes of the tensors in a (nested) state dict: what torch / safetensors write of it."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    return 0


def model_probe(cfg: RunConfig, length: int, budget_s: float = 3.0, threads: int | None = None,
                graphs: bool = False) -> dict:
    """A point's model (`build_model` of its `step_config`) trained for ~budget_s at
    [batch_size x length] tokens with the loop's own step, its run's loss, optimizer groups and
    precision, then evaluated (no gradients) at [eval_batch_size x length]: s/step, s per
    evaluation batch, the peak device memory (CUDA: max_memory_allocated; CPU: the process's
    RSS growth) and the byte sizes a run's checkpoint holds (model; optimizer state after the
    steps) and `checkpoint_s`, the seconds to write them (accelerate's save_state). `graphs`:
    the encoder captured as a run's `cuda_graphs` does (kit.models.regional_compile), compiling
    and recording timed (`graph_warmup_s`)."""
    from kit.models.regional_compile import capture_graphs
    from kit.models.transformers_adapter import attn_implementation
    from kit.train.accel import make_accelerator
    from kit.train.optim import merged_groups, parameter_groups
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        accelerator = make_accelerator(cfg.mixed_precision)
        device = accelerator.device
        cuda = device.type == "cuda"
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        build_model(cfg)            # once untimed: a kernel imports the model's code once
        built = time.perf_counter()
        model, tokenizer = build_model(cfg)
        built = time.perf_counter() - built
        # CPU: the weights count once, then what training adds (gradients, optimizer, activations)
        weights = state_bytes(model.state_dict())
        rss = None if cuda else PeakRss()
        optimizer = torch.optim.AdamW(merged_groups(parameter_groups(
            model, 1e-5, 0.01, 1.0, cfg.freeze_layers)), lr=1e-5,
            fused=device.type in ("cpu", "cuda"))
        model, optimizer = accelerator.prepare(model, optimizer)
        vocab = min(tokenizer.vocab_size, 20000)
        batch = random_batch(cfg.batch_size, length, vocab, device)
        if accelerator.unwrap_model(model).token_head is not None:   # SSA's loss on its labels
            batch["ssa_labels"] = torch.randint(0, 2, (cfg.batch_size, length), device=device)
        step = stepper(accelerator, model, optimizer, batch,
                       lambda model, inputs: run_loss(cfg, model, inputs, regression=False))
        evaluate = random_batch(cfg.eval_batch_size, length, vocab, device)

        def forward(_full: bool):
            with torch.no_grad():
                model.eval()
                model(input_ids=evaluate["input_ids"], attention_mask=evaluate["attention_mask"],
                      special_mask=evaluate["special_mask"])
                model.train()
            sync_device(device)
        warmup_s = 0.0
        if graphs:        # compiled on the first call, recorded on the third: full shapes only
            capture_graphs(accelerator.unwrap_model(model))
            warmup_s = time.perf_counter()
            for _ in range(3):
                step(True)
                forward(True)
            warmup_s = time.perf_counter() - warmup_s
        s_step, steps = time_steps(step, budget_s, warmup=0 if graphs else 1, low=True)
        s_eval, _ = time_steps(forward, budget_s / 3, warmup=0 if graphs else 1, low=True)
        memory = torch.cuda.max_memory_allocated(device) if cuda else weights + rss.growth()
        with tempfile.TemporaryDirectory() as folder:   # `last` as kit.train.run_state writes it
            checkpoint_s = time.perf_counter()
            accelerator.save_state(folder)
            checkpoint_s = time.perf_counter() - checkpoint_s
        unwrapped = accelerator.unwrap_model(model)
        return {"s_per_step": s_step, "steps": steps, "s_per_eval_batch": s_eval,
                "peak_memory_bytes": int(memory), "memory_kind": "max_memory_allocated"
                if cuda else "weights + RSS growth", "device": str(device), "build_s": built,
                "precision": accelerator.mixed_precision, "graphs": graphs,
                "graph_warmup_s": warmup_s, "checkpoint_s": checkpoint_s,
                "parameters": sum(p.numel() for p in unwrapped.parameters()),
                "model_bytes": state_bytes(unwrapped.state_dict()),
                "optimizer_bytes": state_bytes(optimizer.state_dict()["state"]),
                "threads": torch.get_num_threads(), "method": cfg.method,
                "guide_loss": cfg.guide_loss,
                "attention": attn_implementation(unwrapped.backbone.config)}
    finally:
        torch.set_num_threads(before)
