"""Signal to exit: how long a run takes to stop once SIGUSR1 lands in a training step, in the
evaluation of the dev set, or in SSA label generation.

The run stops at the next check of its stop flag - after the current optimizer step, or between
two batches of a pass over data (kit.train.preemption.Stop.between_batches) - writes what it
needs to resume (a mid-epoch checkpoint; nothing in label generation, where the previous
epoch's checkpoint already holds everything) and raises RunPreempted once metrics.json says
`preempted`. All three scenarios run in this one process, one after another, each in a fresh
outputs folder under --workdir, with real signals (os.kill to itself from inside the pass):

    train    method bert, the signal during step --at x the epoch's steps of epoch 0
    eval     method bert, the signal during batch --at x the dev set's batches of epoch 0's
             evaluation (the task's whole dev set, --eval-batch-size rows a batch)
    labels   method ssa-h with ssa_start_epoch 0 (epoch 0 probes the pretrained model), the
             signal during batch --at x the batches of the first probing pass (the train rows)

Measured: from os.kill to fit() raising (`signal -> exit`), the mean time of one batch of that
pass before the signal, the checkpoint write inside the stop (run_state.save_inside, timed),
and the rest of the pass at the measured rate: what a stop waited for when passes did not look
at the flag (plus, in evaluation, the end-of-epoch checkpoint).

    python bench/signal_latency.py --threads 2 --json outputs/bench/signal_latency_sst2.json
    python bench/signal_latency.py --quick
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

QUICK = {"task": "RTE", "max_train": 64, "probe_rows": 128}


def main() -> None:
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.set_defaults(task="SST-2", max_train=128, epochs=2)
    parser.add_argument("--eval-batch-size", type=int, default=128,
                        help="rows per evaluation / probing batch (the kit's default)")
    parser.add_argument("--probe-rows", type=int, default=1024,
                        help="labels: train rows probed by SSA label generation")
    parser.add_argument("--at", type=float, default=0.5,
                        help="where in the pass the signal lands (share of its batches)")
    parser.add_argument("--scenarios", default="train,eval,labels")
    parser.add_argument("--workdir", default=tempfile.gettempdir())
    args = common.parse(parser, QUICK)
    common.check_environment()
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    meta = common.print_header("Signal to exit")
    results = [scenario(args, name) for name in args.scenarios.split(",")]
    print(common.markdown_table(
        ["signal during", "pass: batches (rows)", "signal in batch", "one batch s",
         "signal -> exit s", "of which checkpoint s", "batches after the signal's, s"],
        [[r["during"], f"{r['batches']} ({r['rows']})", r["signal_batch"], r["batch_s"],
          r["latency_s"], r["checkpoint_s"], r["rest_of_pass_s"]] for r in results]))
    common.dump_json(args.json, {**meta, "settings": vars(args), "results": results})


def scenario(args, name: str) -> dict:
    """One stopped run: the signal inside the pass `name` names; its timings."""
    from kit.runs import RunPreempted, read_metrics, run_dir_of
    from kit.train.finetune import fit
    labels = name == "labels"
    outputs = tempfile.mkdtemp(prefix=f"signal-{name}-", dir=args.workdir)
    cfg = common.kit_config(
        argparse.Namespace(**{**vars(args), "max_train": args.probe_rows}) if labels else args,
        outputs, method="ssa-h" if labels else "bert", eval_batch_size=args.eval_batch_size,
        report_to=("none",), **({"ssa_start_epoch": 0} if labels else {}))
    watch = Watch(name, args.at)
    if name == "train":                  # epoch 0's steps: its rows in batches
        watch.rows, watch.total = args.max_train, -(-args.max_train // args.batch_size)
    with watch.installed():
        try:
            fit(cfg)
            raise SystemExit(f"{name}: the run ended without stopping")
        except RunPreempted:
            exit_at = time.perf_counter()
    stopped = read_metrics(run_dir_of(cfg))["preempted"]
    batch_s = statistics.mean(watch.durations) if watch.durations else None
    result = {"scenario": name, "during": stopped["during"], "rows": watch.rows,
              "batches": watch.total, "signal_batch": watch.signal_batch,
              "batch_s": round(batch_s, 3) if batch_s else None,
              "latency_s": round(exit_at - watch.signalled_at, 3),
              "checkpoint_s": round(watch.checkpoint_s, 3),
              "rest_of_pass_s": round(batch_s * (watch.total - watch.signal_batch), 3)
              if batch_s else None, "preempted": stopped}
    print(f"{name}: {result}", flush=True)
    return result


class Watch:
    """Hooks on the loop that time the watched pass's batches, send SIGUSR1 during batch
    `at` x its batches, and time the checkpoint the stop writes."""

    def __init__(self, name: str, at: float):
        self.name, self.at = name, at
        self.rows = self.total = self.signal_batch = 0
        self.durations, self.checkpoint_s, self.signalled_at = [], 0.0, None
        self.watching, self.last = False, None

    def batch(self) -> None:
        """Called as each batch of the watched pass starts."""
        now = time.perf_counter()
        if self.last is not None and self.signalled_at is None:
            self.durations.append(now - self.last)
        self.last = now
        done = len(self.durations) + 1
        if self.signalled_at is None and done >= max(1, round(self.at * self.total)):
            self.signal_batch = done
            self.signalled_at = time.perf_counter()
            os.kill(os.getpid(), signal.SIGUSR1)

    def installed(self):
        import contextlib

        from kit.data.pipeline import sorted_batches
        from kit.train import loop, run_state
        from kit.train import step as kstep
        watch = self

        @contextlib.contextmanager
        def hooks():
            real = (loop.predict_logits, kstep.collate, loop.train_step, run_state.save_inside)

            def predict(model, examples, batch_size, *rest):
                desc = rest[2] if len(rest) > 2 else "eval"
                first = watch.rows == 0
                wanted = ("label generation" in desc) if watch.name == "labels" else (
                    watch.name == "eval" and "label generation" not in desc)
                watch.watching = first and wanted
                if watch.watching:
                    watch.rows = len(examples)
                    watch.total = len(sorted_batches(examples.lengths, batch_size))
                try:
                    return real[0](model, examples, batch_size, *rest)
                finally:
                    watch.watching = False

            def collate(*a, **k):
                if watch.watching:
                    watch.batch()
                return real[1](*a, **k)

            def train_step(*a, **k):
                if watch.name == "train" and watch.signalled_at is None:
                    watch.batch()
                return real[2](*a, **k)

            def save_inside(*a, **k):
                t0 = time.perf_counter()
                try:
                    return real[3](*a, **k)
                finally:
                    watch.checkpoint_s += time.perf_counter() - t0
            loop.predict_logits, kstep.collate = predict, collate
            loop.train_step, run_state.save_inside = train_step, save_inside
            try:
                yield
            finally:
                loop.predict_logits, kstep.collate, loop.train_step, run_state.save_inside = real
        return hooks()


if __name__ == "__main__":
    main()
