"""A planned point's seconds, memory and disk (kit.plan): the work kit.cluster.costs counts,
priced with the numbers kit.train.model_probe measured of the point's own step."""
from __future__ import annotations

from kit.cluster import costs
from kit.config.run_config import RunConfig
from kit.config.rules import guided


def label(cfg: RunConfig) -> str:
    """A point's row: its task, method (and guide loss where it has one) and seed."""
    guide = f" {cfg.guide_loss}" if guided(cfg.guide_loss) else ""
    return f"{cfg.task} {cfg.method}{guide} s{cfg.seed}"


def between(at, length: float) -> dict:
    """A probe's numbers at a mean `length`: on the line between the probes `at` its two length
    classes (kit.cluster.costs.length_classes); memory and bytes the upper class's where the
    line reaches it."""
    lower, upper, w = costs.length_classes(length)
    low = at(lower)
    if w == 0:
        return low
    high = at(upper)
    return {**high, **{k: low[k] + w * (high[k] - low[k]) for k in ("s_per_step",
                                                                     "s_per_eval_batch")}}


def point_cost(cfg: RunConfig, facts: costs.TaskFacts, train: dict, evaluate: dict,
               probing: dict | None, tokenizer_bytes: int) -> dict:
    """A point's cost from the probes (`between`) at its training batches' length, its dev and
    test rows' and its training rows' (what SSA probes; None where it probes nothing).
    `facts.tokenize_s`: what tokenizing costs this point (0 where an earlier point of its
    token cache key did it)."""
    work = costs.work(cfg, facts)
    # a step's cost is not proportional to its tokens (weights, optimizer): it is taken as probed
    train_s = work.steps * train["s_per_step"]
    eval_s = ((work.eval_rows - work.probe_rows) * evaluate["s_per_eval_batch"]
              + work.probe_rows * (probing or evaluate)["s_per_eval_batch"]) / cfg.eval_batch_size
    # the model built, the rows tokenized; with CUDA graphs each run compiles and records its
    # own (a kernel's first compilation, as probed: inductor's cache makes later ones shorter)
    prepare_s = train["build_s"] + facts.tokenize_s + train.get("graph_warmup_s", 0.0)
    # `last` every epoch and every checkpoint_minutes; `best` each epoch it improves where it is
    # kept or predicts the test set (counted as every epoch: an upper bound), its share of `last`
    last_s = train.get("checkpoint_s", 0.0)
    best_s = last_s * train["model_bytes"] / (train["model_bytes"] + train["optimizer_bytes"])
    inside = int(train_s // (cfg.checkpoint_minutes * 60)) if cfg.checkpoint_minutes else 0
    if cfg.checkpoint_steps:
        inside = max(inside, work.steps // cfg.checkpoint_steps)
    keeps_best = cfg.save_checkpoints or bool(facts.test_rows)
    write_s = (work.epochs + inside) * last_s + (work.epochs * best_s if keeps_best else 0.0)
    seconds = train_s + eval_s + prepare_s + write_s
    disk = costs.disk(cfg, facts, train["model_bytes"], train["optimizer_bytes"],
                      tokenizer_bytes)
    probed = [p for p in (train, evaluate, probing) if p is not None]
    return {"run_id": cfg.run_id, "label": label(cfg), "model": cfg.model,
            "train_rows": facts.train_rows, "dev_rows": facts.dev_rows,
            "test_rows": facts.test_rows, "rows_from": facts.counts, "data": facts.source,
            "tokens": round(facts.train_length, 1), "epochs": work.epochs,
            "batch_size": cfg.batch_size, "steps": work.steps, "gamma": cfg.gamma,
            "extra_examples": work.extra_rows, "eval_rows": work.eval_rows,
            "probe_rows": work.probe_rows, "seconds": round(seconds, 1),
            "train_s": round(train_s, 1), "eval_s": round(eval_s, 1),
            "prepare_s": round(prepare_s, 1), "tokenize_s": round(facts.tokenize_s, 1),
            "checkpoint_s": round(write_s, 1),
            "memory_bytes": max(p["peak_memory_bytes"] for p in probed),
            "disk_kept_bytes": disk.kept, "disk_peak_bytes": disk.peak,
            "keeps_checkpoint": cfg.save_checkpoints, "cuda_graphs": train.get("graphs", False),
            "attention": train.get("attention", ""), "step_method": train.get("method", "")}
