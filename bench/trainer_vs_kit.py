"""The kit's vanilla fine-tuning loop vs the plain Hugging Face Trainer, side by side.

Same model, same train rows (the kit's fixed shuffle, first --max-train), same batch size,
max length, epochs, lr, seed, 10% linear warm-up, weight decay 0.01, grad-norm clip 1.0.
Contenders (each in its own fresh process, so peak RSS is its own):

    kit              fit(RunConfig(method="bert")), length-grouped batches (the kit's default)
    kit-random       the same with group_by_length=False: plain shuffled batches, like Trainer's
                     default - separates "faster loop" from "less padding"
    kit-compiled     kit with compile=True: the encoder's layer compiled (regional; compilation
                     is inside the training time)
    trainer          Trainer + AutoModelForSequenceClassification + DataCollatorWithPadding
    trainer-grouped  the same with train_sampling_strategy="group_by_length" (transformers 5.x;
                     4.x spelled it group_by_length=True, which 5.x no longer accepts)

Measured: training wall time only (no eval, no loading), examples/s, seconds per epoch, peak
RSS of the contender's process, the final dev metric on the full dev set, and the share of real
(non-padding) tokens each batching feeds the model.

    python bench/trainer_vs_kit.py --task RTE --json outputs/bench/trainer_vs_kit_rte.json
    python bench/trainer_vs_kit.py --quick

A contender may carry its precision: kit@bf16, kit@no, trainer-grouped@bf16 (Trainer's
bf16=True, autocast on a CPU too), trainer@no. fp32 and bf16 matmul peaks are measured right
before and after every contender; --rounds alternates the contenders' order.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

CONTENDERS = ("kit", "kit-random", "kit-compiled", "trainer", "trainer-grouped")
QUICK = {"task": "RTE", "max_train": 128, "epochs": 1}   # ~2.5 min for 4 contenders


def main() -> None:
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--contenders", default=",".join(CONTENDERS),
                        help=f"comma-separated subset of {', '.join(CONTENDERS)}, each optionally "
                             "@no / @bf16 / @fp16 (its precision: kit@bf16, trainer-grouped@bf16)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the contenders this many times, alternating their order "
                             "(A B C, C B A, ...) so a drifting machine load hits all alike")
    args = common.parse(parser, QUICK)
    common.check_environment()
    if args.child:
        common.setup_child(args)
        base, precision = split_contender(args.child)
        run = {"kit": lambda: run_kit(args, True, precision or args.precision),
               "kit-random": lambda: run_kit(args, False, precision or args.precision),
               "kit-compiled": lambda: run_kit(args, True, precision or args.precision, True),
               "trainer": lambda: run_trainer(args, grouped=False, precision=precision),
               "trainer-grouped": lambda: run_trainer(args, grouped=True, precision=precision)
               }[base]
        common.write_result(args.result, run())
        return

    names = [n.strip() for n in args.contenders.split(",") if n.strip()]
    unknown = {n for n in names if split_contender(n)[0] not in CONTENDERS
               or split_contender(n)[1] not in (None, *PRECISIONS)}
    if unknown or args.model == "tiny":
        raise SystemExit(f"unknown contender(s) {sorted(unknown)}" if unknown else
                         "--model tiny is kit-only; give a Hugging Face folder (or minilm)")
    meta = common.print_header("Trainer vs kit")
    from kit.models.backbones import model_path
    padding, lengths = padding_shares(args)
    useful_flops = common.training_flops(model_path(args.model), lengths, args.epochs)
    common.setup_child(args)                 # the peaks with the contenders' thread count
    print(f"useful training FLOPs: {useful_flops:.3e}", flush=True)
    results, before = [], common.peaks()
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            r = common.run_child(__file__, common.child_argv(args), name)
            after = common.peaks()
            r.update(contender=name, round=round_, peaks=common.around(before, after),
                     real_token_share=padding[BATCHING[split_contender(name)[0]]],
                     useful_flops_per_s=useful_flops / r["train_s"])
            r["share_of_peak"] = {d: round(r["useful_flops_per_s"] / v["mean"], 4)
                                  for d, v in r["peaks"].items()}
            results.append(r)
            before = after                   # this contender's "after" is the next one's "before"
    report(args, results, padding)
    common.dump_json(args.json, {**meta, "settings": vars(args), "padding": padding,
                                 "useful_training_flops": useful_flops, "results": results})


PRECISIONS = ("auto", "no", "bf16", "fp16")


def split_contender(spec: str) -> tuple[str, str | None]:
    """"kit@bf16" -> ("kit", "bf16"); "trainer" -> ("trainer", None): the contender's default
    precision (the kit: --precision; Trainer: fp32, or the kit's GPU precision on a GPU)."""
    base, _, precision = spec.partition("@")
    return base, precision or None


# ----------------------------------------------------------------------------- contenders

def run_kit(args, grouped: bool, precision: str, compiled: bool = False) -> dict:
    from kit.train.metrics import reported_metrics
    from kit.config.tasks import get_task
    from kit.train.finetune import fit
    with tempfile.TemporaryDirectory() as out:
        m = fit(common.kit_config(args, out, method="bert", group_by_length=grouped,
                                  mixed_precision=precision, compile=compiled))
    metric = reported_metrics(get_task(args.task))[0]
    return {"train_s": m["wall_s"]["train"], "train_examples": m["train_examples"],
            # the kit evaluates after every epoch; report the cost of one evaluation
            "eval_s": round(m["wall_s"]["eval"] / args.epochs, 3),
            "metric": metric, "dev_metric": m["last_dev"][metric], "device": m["device"],
            "precision": m["mixed_precision"]}


def run_trainer(args, grouped: bool, precision: str | None = None) -> dict:
    import numpy as np
    import torch
    from transformers import (AutoModelForSequenceClassification, AutoTokenizer,
                              DataCollatorWithPadding, Trainer, TrainingArguments, set_seed)

    from kit.train.accel import cuda_has_native_bf16
    from kit.data.pipeline import load_task_data
    from kit.train.metrics import evaluate_splits, reported_metrics
    from kit.models.backbones import model_path

    # the kit's loader gives the exact rows the kit trains on (same capped shuffle)
    data = load_task_data(common.kit_config(args, "unused"))
    task = data.task
    path = model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)

    def rows(split):   # unpadded, like the kit: DataCollatorWithPadding pads per batch
        enc = tokenizer(split.text_a, split.text_b, truncation=True, max_length=args.max_length)
        return [{**{k: v[i] for k, v in enc.items()}, "labels": int(split.labels[i])}
                for i in range(len(split))]

    train, dev = rows(data.train), {name: rows(split) for name, split in data.dev.items()}
    set_seed(args.seed)                       # the classifier's random init
    model = AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=task.num_labels, attn_implementation="sdpa")   # the kit's attention too
    cuda = torch.cuda.is_available()
    # Trainer's default is fp32 everywhere; the kit's "auto" uses bf16 (fp16) + tf32 on a GPU.
    # Without a precision given, match the kit on a GPU so a GPU comparison is not a precision
    # comparison; on a CPU keep Trainer's default. Given: bf16=True is autocast on a CPU too.
    bf16 = (cuda and cuda_has_native_bf16()) if precision is None else precision == "bf16"
    fp16 = (cuda and not bf16) if precision is None else precision == "fp16"
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(
            output_dir=out, per_device_train_batch_size=args.batch_size,
            per_device_eval_batch_size=128,          # the kit's eval_batch_size
            num_train_epochs=args.epochs, learning_rate=args.lr, weight_decay=0.01,
            warmup_steps=0.1,                        # 5.x: a float < 1 is a ratio (no warmup_ratio)
            lr_scheduler_type="linear", max_grad_norm=1.0, seed=args.seed,
            train_sampling_strategy="group_by_length" if grouped else "random",
            save_strategy="no", eval_strategy="no", logging_strategy="no", report_to=[],
            disable_tqdm=True, use_cpu=not cuda, dataloader_num_workers=0,
            bf16=bf16, fp16=fp16, tf32=True if cuda else None)
        trainer = Trainer(model=model, args=targs, train_dataset=train,
                          data_collator=DataCollatorWithPadding(tokenizer),
                          processing_class=tokenizer)
        t0 = time.perf_counter()
        trainer.train()
        train_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        results = {}
        for name, split in dev.items():
            # transformers 5.x: with train_sampling_strategy="group_by_length" the EVAL sampler
            # is length-grouped too, so predict() returns rows in a shuffled order; its label_ids
            # come in that same order (scored against the dataset's order, SST-2 read 0.50-0.53)
            out = trainer.predict(split)
            logits = out.predictions[0] if isinstance(out.predictions, tuple) else out.predictions
            results[name] = (np.asarray(logits).argmax(-1), np.asarray(out.label_ids))
        eval_s = time.perf_counter() - t0
    metric = reported_metrics(task)[0]
    return {"train_s": round(train_s, 3), "train_examples": len(train) * args.epochs,
            "eval_s": round(eval_s, 3), "metric": metric,
            "dev_metric": evaluate_splits(task, results)[metric],
            "device": str(trainer.args.device), "precision": "bf16" if bf16 else
            "fp16" if fp16 else "no", "optimizer": str(targs.optim)}


# ----------------------------------------------------------------------------- padding

BATCHING = {"kit": "kit length-grouped", "kit-random": "random",
            "kit-compiled": "kit length-grouped",
            "trainer": "random", "trainer-grouped": "Trainer LengthGroupedSampler"}


def padding_shares(args) -> tuple:
    """Real tokens / padded tokens over all training batches of the run, per batching, and the
    training rows' real lengths. The kit's batches are the exact ones fit() draws (same generator
    seeds); Trainer's are drawn with its own sampler classes from an equally seeded generator."""
    import numpy as np
    import torch
    from transformers.trainer_pt_utils import LengthGroupedSampler

    from kit.data.pipeline import encode, length_grouped_batches, load_task_data, random_batches
    from kit.models.backbones import load_tokenizer

    data = load_task_data(common.kit_config(args, "unused"))
    lengths = encode(load_tokenizer(args.model), data.train, args.max_length,
                     data.task.regression).lengths
    n, bs = len(lengths), args.batch_size

    def chunks(order):
        return [order[i:i + bs] for i in range(0, n, bs)]

    draws = {"random": [], "kit length-grouped": [], "Trainer LengthGroupedSampler": []}
    for epoch in range(args.epochs):
        rng = np.random.default_rng([args.seed, epoch])        # what fit() seeds per epoch
        draws["kit length-grouped"] += length_grouped_batches(lengths, bs, rng)
        draws["random"] += random_batches(n, bs, np.random.default_rng([args.seed, epoch]))
        gen = torch.Generator().manual_seed(args.seed + epoch)
        sampler = LengthGroupedSampler(bs, lengths=lengths.tolist(), generator=gen)
        draws["Trainer LengthGroupedSampler"] += chunks(list(sampler))
    share = {}
    for name, batches in draws.items():
        real = sum(int(lengths[b].sum()) for b in batches)
        padded = sum(len(b) * int(lengths[b].max()) for b in batches)
        share[name] = round(real / padded, 4)
    share["mean_length"] = round(float(lengths.mean()), 1)
    share["train_rows"] = n
    return share, lengths


# ----------------------------------------------------------------------------- report

def report(args, results: list[dict], padding: dict) -> None:
    rows = []
    for r in results:
        r["examples_per_s"] = round(r["train_examples"] / r["train_s"], 2)
        r["epoch_s"] = round(r["train_s"] / args.epochs, 3)
        p = r["peaks"]
        rows.append([r["contender"], r["round"], r["precision"], r["examples_per_s"], r["epoch_s"],
                     r["eval_s"], common.memory_mb(r), f"{r['real_token_share']:.1%}",
                     r["useful_flops_per_s"] / 1e9,
                     *(f"{p[d]['mean'] / 1e9:,.0f} ({p[d]['drift']:.2f})" for d in p),
                     *(f"{r['share_of_peak'][d]:.1%}" for d in p),
                     r["dev_metric"], r["process_wall_s"]])
    memory = "peak GPU MB" if any("peak_gpu_mb" in r for r in results) else "peak RSS MB"
    dtypes = list(results[0]["peaks"])
    short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
    print(f"\n{args.task}: {padding['train_rows']} train rows (mean {padding['mean_length']} "
          f"tokens), {args.epochs} epoch(s), batch {args.batch_size}, max length "
          f"{args.max_length}, lr {args.lr}, seed {args.seed}, model {args.model}\n")
    print(common.markdown_table(
        ["contender", "round", "precision", "train ex/s", "s/epoch", "eval s", memory,
         "real-token share", "useful GFLOP/s",
         *(f"{short[d]} peak GFLOP/s (after/before)" for d in dtypes),
         *(f"of {short[d]} peak" for d in dtypes), f"dev {results[0]['metric']}", "process s"],
        rows))
    print("\nuseful GFLOP/s: model FLOPs on real (non-padding) tokens per second of training; "
          "each contender's peaks: the mean of the matmul peaks measured right before and right "
          "after it (in brackets: after / before, the drift while it ran)")
    print("\nreal-token share per batching: " + ", ".join(
        f"{k} {v:.1%}" for k, v in padding.items() if k not in ("mean_length", "train_rows")))
    lines = []
    first = results[0]["contender"]
    for round_ in sorted({r["round"] for r in results}):
        got = {r["contender"]: r for r in results if r["round"] == round_}
        for name, other in got.items():
            if name != first and first in got:
                a = got[first]
                speed = common.ratio(a["examples_per_s"], other["examples_per_s"])
                memory = common.ratio(common.memory_mb(a), common.memory_mb(other))
                lines.append(f"- round {round_}: {first} / {name}: throughput x{speed}, "
                             f"peak memory x{memory}")
    if lines:
        print(f"\nratios {first} / each other contender of the same round (throughput above 1: "
              f"{first} is faster):\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
