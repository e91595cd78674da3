"""One contender of bench/gpu.sh, in a process of its own, with the step-level measurements:

    steady steps/s     host timestamps of the training steps of the second epoch's first 60%
                       (a step without host reads queues ahead, so the rate over many steps is
                       the device's), examples/s from the batch size
    warm-up s          the first epoch's time (from its first step's start) beyond what its
                       steps cost at the steady rate (first use of every shape, allocator
                       growth, compilation)
    syncs              torch.cuda.set_sync_debug_mode("warn") during 10 training steps after
                       the steady window, and during the last evaluation pass: warnings counted
                       per step and per evaluation batch (CUDA only; None on a CPU)
    kernels, busy      torch.profiler over 5 steps after those: CUDA kernels per step and the
                       share of the window's wall time some kernel ran (CPU: aten ops per step)

Contenders: `kit` (fit(), method bert), `kit-buckets` (length_buckets on), `kit-graphs`
(cuda_graphs on: the encoder replayed as CUDA graphs, one per bucket), `kit-old` (the same
harness on the kit of another commit: its folder comes first on sys.path, --kit-root),
`trainer-grouped` (Trainer, group_by_length, bf16) and `trainer-compiled` (the same with
torch_compile, mode reduce-overhead).

    python bench/gpu_child.py CONTENDER --settings settings.json --result out.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import tempfile
import time
import warnings
from pathlib import Path

SYNC_STEPS, PROFILE_STEPS = 10, 5


class Probe:
    """Per-step hooks: timestamps, then a window of sync counting, then a profiled window."""

    def __init__(self, steps_per_epoch: int, cuda: bool):
        spe = steps_per_epoch
        self.spe, self.cuda, self.ends, self.step, self.first = spe, cuda, [], 0, None
        self.steady = (spe + min(2, spe // 4), spe + max(2, int(0.6 * spe)))
        self.sync_window = (self.steady[1], self.steady[1] + min(SYNC_STEPS, spe // 5 or 1))
        self.prof_window = (self.sync_window[1], self.sync_window[1] + min(PROFILE_STEPS,
                                                                           spe // 5 or 1))
        self.syncs: list[int] = []
        self.out: dict = {}
        self._counting = self._profiler = None

    def begin(self) -> None:
        self.first = self.first or time.perf_counter()      # the first step's start
        if self.step == self.sync_window[0]:
            self._counting = SyncCounter(self.cuda).open()
        if self.step == self.prof_window[0]:
            self._profiler = Profiled(self.cuda).__enter__()

    def end(self) -> None:
        self.step += 1
        self.ends.append(time.perf_counter())
        if self._counting and self.step == self.sync_window[1]:
            self.out["syncs_per_train_step"] = per_batch(self._counting.close(),
                                                         self.window(self.sync_window), 1)
            self._counting = None
        if self._profiler and self.step == self.prof_window[1]:
            self.out.update(self._profiler.close(self.window(self.prof_window)))
            self._profiler = None

    @staticmethod
    def window(bounds: tuple[int, int]) -> int:
        return bounds[1] - bounds[0]

    def summary(self, batch_size: int) -> dict:
        a, b = self.steady
        ok = len(self.ends) >= b > a
        rate = (b - a) / (self.ends[b - 1] - self.ends[a - 1]) if ok else None
        first = self.ends[self.spe - 1] - self.first if len(self.ends) >= self.spe else None
        return {"steps": len(self.ends), "steps_per_epoch": self.spe,
                "steady_steps_per_s": rate, "steady_examples_per_s": rate and rate * batch_size,
                "first_epoch_s": first,
                "warmup_s": first - self.spe / rate if rate and first else None,
                "syncs_per_train_step": None, **self.out}


class SyncCounter:
    """Counts CUDA's synchronizing calls (sync debug mode 'warn') while open; None on a CPU."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def open(self) -> SyncCounter:
        if self.cuda:
            import torch
            self._catch = warnings.catch_warnings(record=True)
            self._log = self._catch.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def close(self) -> int | None:
        if not self.cuda:
            return None
        import torch
        torch.cuda.set_sync_debug_mode(0)
        self._catch.__exit__(None, None, None)
        return sum("synchroniz" in str(w.message) for w in self._log)


class Profiled:
    """torch.profiler over a window of steps: kernels per step and the GPU's busy share."""

    def __init__(self, cuda: bool):
        import torch
        from torch.profiler import ProfilerActivity, profile
        self.torch, self.cuda = torch, cuda
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        self.prof = profile(activities=activities)

    def __enter__(self) -> Profiled:
        if self.cuda:
            self.torch.cuda.synchronize()
        self.t0 = time.perf_counter()
        self.prof.__enter__()
        return self

    def close(self, steps: int) -> dict:
        if self.cuda:
            self.torch.cuda.synchronize()
        wall_us = (time.perf_counter() - self.t0) * 1e6
        self.prof.__exit__(None, None, None)
        events = self.prof.events()
        if not self.cuda:
            ops = sum(e.name.startswith("aten::") for e in events)
            return {"cpu_ops_per_step": ops / steps}
        from torch.autograd import DeviceType
        kernels = [e for e in events if e.device_type == DeviceType.CUDA
                   and not e.name.startswith(("Memcpy", "Memset"))]
        spans = sorted((e.time_range.start, e.time_range.end) for e in kernels)
        busy, reach = 0.0, -math.inf
        for start, end in spans:           # the union of the kernels' intervals
            if end > reach:
                busy += end - max(start, reach)
                reach = end
        return {"kernels_per_step": len(kernels) / steps, "gpu_busy_share": busy / wall_us}


def run_kit(s: dict, probe: Probe, **overrides) -> dict:
    """fit() of method bert with the probe around the loop's training steps and the last
    evaluation pass; `s`: the parent's settings."""
    from kit.config.run_config import RunConfig
    from kit.train import loop
    from kit.train.finetune import fit
    predict, eval_syncs = loop.predict_logits, {}

    def predicted(model, examples, batch_size, *args, **kwargs):
        if probe.step < 2 * probe.spe or "per_eval_batch" in eval_syncs:    # not the last
            return predict(model, examples, batch_size, *args, **kwargs)
        counter = SyncCounter(probe.cuda).open()
        try:
            return predict(model, examples, batch_size, *args, **kwargs)
        finally:
            eval_syncs["per_eval_batch"] = per_batch(counter.close(), len(examples), batch_size)

    loop.predict_logits = predicted
    with around_steps(probe.begin, probe.end), tempfile.TemporaryDirectory() as out:
        m = fit(RunConfig(task=s["task"], model=s["model"], seed=0, max_length=s["max_length"],
                          max_train_examples=s["rows"], epochs=2, batch_size=s["batch_size"],
                          lr=2e-5, weight_decay=0.01, warmup_ratio=0.1, outputs_dir=out,
                          save_checkpoints=False, mixed_precision=s["precision"], **overrides))
    return {**probe.summary(s["batch_size"]),
            "syncs_per_eval_batch": eval_syncs.get("per_eval_batch"),
            "precision": m["mixed_precision"], "device": m["device"],
            "train_s": m["wall_s"]["train"]}


@contextlib.contextmanager
def around_steps(before=lambda: None, after=lambda: None):
    """kit.train.loop.train_step wrapped while open: `before()` and `after()` around each
    training step (a probe's hooks; a signal sent from inside a step, as a scheduler's lands)."""
    from kit.train import loop
    step = loop.train_step

    def wrapped(*args, **kwargs):
        before()
        out = step(*args, **kwargs)
        after()
        return out
    loop.train_step = wrapped
    try:
        yield
    finally:
        loop.train_step = step


def run_trainer(s: dict, probe: Probe, compiled: bool) -> dict:
    """Trainer with group_by_length and bf16 (on a CPU: the settings' precision), the probe in
    a callback; `compiled`: torch_compile with mode reduce-overhead (CUDA graphs)."""
    import torch
    from transformers import (AutoModelForSequenceClassification, AutoTokenizer,
                              DataCollatorWithPadding, Trainer, TrainerCallback,
                              TrainingArguments, set_seed)

    from kit.config.run_config import RunConfig
    from kit.data.pipeline import load_task_data
    data = load_task_data(RunConfig(task=s["task"], model=s["model"], seed=0,
                                    max_train_examples=s["rows"], max_length=s["max_length"]))
    tokenizer = AutoTokenizer.from_pretrained(s["model"])

    def rows(split):
        enc = tokenizer(split.text_a, split.text_b, truncation=True, max_length=s["max_length"])
        return [{**{k: v[i] for k, v in enc.items()}, "labels": int(split.labels[i])}
                for i in range(len(split))]

    class Hooks(TrainerCallback):
        def on_step_begin(self, *args, **kwargs):
            probe.begin()

        def on_step_end(self, *args, **kwargs):
            probe.end()

    train, dev = rows(data.train), rows(next(iter(data.dev.values())))
    set_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(
        s["model"], num_labels=data.task.num_labels, attn_implementation="sdpa")
    cuda = torch.cuda.is_available()
    bf16 = cuda or s["precision"] == "bf16"
    compile_args = {"torch_compile": True, "torch_compile_mode": "reduce-overhead"} if compiled else {}
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(
            output_dir=out, per_device_train_batch_size=s["batch_size"],
            per_device_eval_batch_size=128, num_train_epochs=2, learning_rate=2e-5,
            weight_decay=0.01, warmup_steps=0.1, lr_scheduler_type="linear", max_grad_norm=1.0,
            seed=0, train_sampling_strategy="group_by_length", save_strategy="no",
            eval_strategy="no", logging_strategy="no", report_to=[], disable_tqdm=True,
            use_cpu=not cuda, dataloader_num_workers=0, bf16=bf16,
            tf32=True if cuda else None, **compile_args)
        trainer = Trainer(model=model, args=targs, train_dataset=train,
                          data_collator=DataCollatorWithPadding(tokenizer),
                          processing_class=tokenizer, callbacks=[Hooks()])
        started = time.perf_counter()
        trainer.train()
        train_s = time.perf_counter() - started
        counter = SyncCounter(cuda).open()
        try:
            trainer.predict(dev)
        finally:
            syncs = per_batch(counter.close(), len(dev), 128)
    return {**probe.summary(s["batch_size"]), "train_s": train_s,
            "syncs_per_eval_batch": syncs,
            "precision": "bf16" if bf16 else "no", "device": str(targs.device)}


def per_batch(count: int | None, rows: int, batch_size: int) -> float | None:
    return None if count is None else count / math.ceil(rows / batch_size)


def steps_per_epoch(s: dict) -> int:
    from kit.config.run_config import RunConfig
    from kit.data.pipeline import load_task_data
    rows = len(load_task_data(RunConfig(task=s["task"], model=s["model"], seed=0,
                                        max_train_examples=s["rows"])).train)
    return math.ceil(rows / s["batch_size"])


# in the order bench/gpu.sh runs them
CONTENDERS = ("kit", "kit-buckets", "kit-graphs", "kit-old", "trainer-grouped", "trainer-compiled")


def run(contender: str, s: dict) -> dict:
    if contender not in CONTENDERS:         # before torch's import: a typo fails at once
        raise ValueError(f"unknown contender {contender!r}: one of {', '.join(CONTENDERS)}")
    import torch
    if s.get("threads"):
        torch.set_num_threads(s["threads"])
    probe = Probe(steps_per_epoch(s), torch.cuda.is_available())
    if contender in ("kit", "kit-old"):
        return run_kit(s, probe)
    if contender == "kit-buckets":
        return run_kit(s, probe, length_buckets="on")
    if contender == "kit-graphs":
        return run_kit(s, probe, cuda_graphs="on")
    return run_trainer(s, probe, compiled=contender == "trainer-compiled")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("contender")
    parser.add_argument("--settings", required=True, help="the parent's settings (JSON)")
    parser.add_argument("--result", required=True)
    parser.add_argument("--kit-root", help="import the kit from this folder (another commit)")
    args = parser.parse_args()
    if args.kit_root:
        sys.path.insert(0, args.kit_root)
    result = run(args.contender, json.loads(Path(args.settings).read_text()))
    Path(args.result).write_text(json.dumps(result, indent=1, default=float))


if __name__ == "__main__":
    main()
