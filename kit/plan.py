"""What a profile will cost before anything trains: per point and in total, the training steps,
the predicted wall time and peak memory on this machine's device, the disk each run keeps, and
what `./run_all.sh slurm` would ask for (kept in outputs/plans/ for slurm's --time).

    ./run_all.sh plan PROFILE [--only KEY=V1,V2 ...] [--per-device K] [--json] [--budget S]

Rows and token lengths come from the tasks' files (kit.cluster.costs; GLUE's official counts
where absent; with length buckets, the buckets' lengths). Time and memory: ~BUDGET s of probing
per distinct step x length class: each point's own model and loss, built as its run builds them
with random weights (kit.train.model_probe: its method's heads, eager attention with maps where
a guide loss reads them), at the 8-token classes around its lengths (the line between them).
A point = its batches x s/step + its evaluated rows (dev each epoch, test, SSA's probing unless
it reuses labels) x s/row + building the model, tokenizing (once per token cache key) + its
checkpoint writes (timed as the probe writes one) + its notebook around the run
(kit.cluster.point_cost); a batch (each slurm task) adds its process's and kernel's start and
its end (tables, report), both timed by running a two-point batch of the tiny model
(kit.cluster.overhead).
--per-device K: K points at once, each probed on cores / K threads (CPU); the total divides by K.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from kit.cluster import costs
from kit.cluster.overhead import NOT_PROBED, batch_probe
from kit.cluster.point_cost import between, label, point_cost
from kit.cluster.slurm_script import DEFAULT_TASKS_CAP
from kit import io as kio
from kit.config.grids import frozen
from kit.config.paths import outputs_root, project_path
from kit.config.profiles import Profile, load_profile
from kit.config.run_config import ConfigError, RunConfig
from kit.data import hub
from kit.data.readers import DataError
from kit.models.backbones import ModelError, is_hub_id, load_tokenizer

MARGIN = 1.5                # slurm --time: the longest task's prediction x MARGIN ...
MARGIN_MIN_S = 600          # ... and at least this much more (start-up, a slower node)
MARGIN_TEXT = f"x{MARGIN} + {MARGIN_MIN_S // 60} min"


def tokenizer_of(model: str):
    """The model's tokenizer, from the local cache when the hub is unreachable: a hub id that
    is not cached is one line saying how to fetch it."""
    offline = is_hub_id(model) and hub.hub_unreachable() is not None
    try:
        return load_tokenizer(model, local_only=offline)
    except ModelError:
        if not offline:
            raise
        raise ModelError(f"model {model!r} is not in the Hugging Face cache and the hub is "
                         f"unreachable: run `./run_all.sh fetch --model {model}` on a networked "
                         "machine first (the same HF_HOME)") from None


def saved_bytes(tokenizer) -> int:
    """The tokenizer's files as a checkpoint folder holds them (written once, measured)."""
    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def plan(profile: Profile, per_device: int = 1, budget_s: float = 3.0, probe=None,
         overhead: dict | None = None) -> dict:
    """The plan as a dict (what --json prints): `points`, `probes`, `batch`, `total`, `slurm`.
    `overhead`: what a batch pays around its points' runs (default: measured,
    kit.cluster.overhead.batch_probe, once a point is planned)."""
    from kit.models.regional_compile import planned_steps, resolve_graphs
    from kit.train.accel import cpu_threads, machine_device
    from kit.train.model_probe import model_probe, step_config
    from kit.train.step import static_shape
    probe = probe or model_probe
    device = machine_device()
    threads = max(1, cpu_threads() // per_device)
    tokenizers, tok_bytes, probes, points, adapted, tokenized = {}, {}, {}, [], {}, set()
    for point in profile.points:
        cfg = RunConfig.from_dict(point)
        if cfg.adapted_dir:            # a later point fine-tunes what this one writes
            adapted[project_path(cfg.adapted_dir)] = adapted.get(project_path(cfg.model), cfg.model)
        # a model an earlier point writes is not there yet: its shapes are its source model's
        run_id = cfg.run_id
        cfg = replace(cfg, model=adapted.get(project_path(cfg.model), cfg.model))
        if (why := costs.plannable_kind(cfg)) is not None:
            points.append({"run_id": run_id, "label": label(cfg), "not_planned": why})
            continue
        if cfg.model not in tokenizers:
            tokenizers[cfg.model] = tokenizer_of(cfg.model)
            tok_bytes[cfg.model] = saved_bytes(tokenizers[cfg.model])
        tokenizer = tokenizers[cfg.model]
        # the graphs the run's own loop will take (kit.train.loop), probed as it will train
        # (one process: a plan's probes run one)
        resolved = resolve_graphs(cfg, device, planned_steps(
            cfg.epochs, costs.task_facts(cfg, tokenizer).train_rows, cfg.batch_size,
            cfg.grad_accum), 1)
        graphs = resolved.graphs
        # its batches padded as the loop pads them: to length buckets where it takes them
        facts = costs.task_facts(cfg, tokenizer, static_shape(
            resolved.length_buckets, cfg.max_length, 0))
        if costs.token_key(cfg) in tokenized:      # an earlier point filled the token cache
            facts = replace(facts, tokenize_s=0.0)
        tokenized.add(costs.token_key(cfg))
        step = step_config(cfg)

        def at(length: int, step=step, graphs=graphs) -> dict:
            if (step, length, graphs) not in probes:    # each distinct step once
                probes[step, length, graphs] = probe(step, length, budget_s=budget_s,
                                                     threads=threads, graphs=graphs)
            return probes[step, length, graphs]
        probing = between(at, facts.eval_length) if costs.work(cfg, facts).probe_rows else None
        points.append({**point_cost(cfg, facts, between(at, facts.train_length),
                                    between(at, facts.dev_length), probing,
                                    tok_bytes[cfg.model]), "run_id": run_id})
    planned = [p for p in points if "seconds" in p]
    if overhead is None:
        overhead = batch_probe() if planned else NOT_PROBED
    for p in planned:
        p["notebook_s"] = overhead["per_point_s"]
        p["seconds"] = round(p["seconds"] + overhead["per_point_s"], 1)
    once_s = overhead["once_s"]
    total = _total(planned, per_device, once_s, shared=device != "cpu")
    return {"profile": profile.name, "per_device": per_device, "threads": threads,
            "device": _device(probes), "points": points,
            "probes": [{"model": step.model, "rows": step.batch_size, "length": length, **p}
                       for (step, length, _), p in probes.items()],
            "batch": overhead,
            "total": total, "slurm": slurm_request(planned, probes, once_s, per_device)}


def saved_path(profile: Profile, outputs: Path) -> Path:
    """Where `./run_all.sh plan` keeps its plan of this grid: outputs/plans/NAME-DIGEST.json,
    DIGEST the hash kit.slurm freezes the same grid under. `./run_all.sh slurm` without --time
    takes its --time from there (made on a GPU node, it serves the login node's submission)."""
    return Path(outputs) / "plans" / f"{profile.name}-{frozen(profile)[1]}.json"


def saved(profile: Profile, outputs: Path) -> dict | None:
    """The plan kept for this grid, or None (none, or unreadable)."""
    try:
        return kio.read_json(saved_path(profile, outputs))
    except (OSError, ValueError):
        return None


# K points on one GPU share its kernels' time: what that gains is measured, not modelled
# (bench/gpu.sh, one H200: K = 2 took 0.78x the wall time of K = 1 on 1,000-row points)
SHARED_K_NOTE = ("K points share one GPU: the total is not divided by K (bench/gpu.sh measures "
                 "what K gains; docs/benchmarks.md)")


def _total(points: list[dict], per_device: int, once_s: float, shared: bool = False) -> dict:
    """The profile's totals, a batch's `once_s` (its process, kernel and end) included.
    `shared`: the K points at once share one accelerator, whose probe timed it alone; the
    seconds stay the serial sum (a CPU's K points each probed on cores / K threads run side by
    side: its total divides by K)."""
    seconds = sum(p["seconds"] for p in points)
    divisor = 1 if shared else per_device
    kept = sum(p["disk_kept_bytes"] for p in points)
    # while K points run, each may hold its peak; the finished ones keep what they keep
    peak = kept + sum(sorted((p["disk_peak_bytes"] for p in points), reverse=True)[:per_device])
    return {"runs": len(points), "seconds": round(seconds / divisor + once_s, 1),
            "k_note": SHARED_K_NOTE if shared and per_device > 1 else "",
            "device_hours": round((seconds + once_s) / 3600, 2),
            "once_s": round(once_s, 1),
            "steps": sum(p["steps"] for p in points),
            "memory_bytes": max((p["memory_bytes"] for p in points), default=0) * per_device,
            "disk_kept_bytes": kept, "disk_needed_bytes": peak}


def _device(probes: dict) -> str:
    from kit.train import provenance
    first = next(iter(probes.values()), None)
    if first and first["device"].startswith("cuda"):
        import torch
        return f"{torch.cuda.get_device_name()} ({first['precision']})"
    cpu = provenance.cpu_info()
    precision = first["precision"] if first else "?"
    from kit.train.accel import cpu_threads
    return (f"{cpu['model']} CPU, class {cpu['cpu_class']}, {cpu_threads()} cores "
            f"({precision})")


def slurm_request(points: list[dict], probes: dict, once_s: float = 0.0,
                  per_device: int = 1) -> dict:
    """What `./run_all.sh slurm` asks for: the array's default tasks (one per point here, at
    most kit.slurm.DEFAULT_TASKS_CAP), each running its points one after another; --time the
    longest task's predicted seconds x MARGIN + MARGIN_MIN_S; --mem the probes' peak memory
    (CPU) or host memory for the weights and data (GPU) with the same margin, for each of the
    `per_device` points a task runs at once (kit.slurm asks so); a GPU a task where the probes
    ran on one."""
    tasks = max(1, min(len(points), DEFAULT_TASKS_CAP))
    longest = once_s + max((sum(p["seconds"] for p in points[i::tasks]) for i in range(tasks)),
                            default=0.0)
    seconds = math.ceil(longest * MARGIN + MARGIN_MIN_S)
    gpu = any(p["device"].startswith("cuda") for p in probes.values())
    return {"tasks": tasks, "time": hms(seconds), "time_s": seconds,
            "longest_task_s": round(longest, 1), "margin": MARGIN_TEXT,
            "mem": costs.task_memory(probes.values(), MARGIN, per_device),
            "points_at_once": per_device, "gpus_per_task": 1 if gpu else 0}


def task_time(result: dict, groups: list[list[str]], nodes: int = 1) -> tuple[str, float]:
    """(--time, the longest task's predicted seconds) for tasks running `groups` of run ids
    one after another (a point the plan could not time counts as its profile's slowest), each
    point on `nodes` nodes at once (kit.cluster.costs.seconds_on_nodes)."""
    seconds = {p["run_id"]: costs.seconds_on_nodes(p, nodes) for p in result["points"]
               if "seconds" in p}
    slowest = max(seconds.values(), default=0.0)
    longest = result["total"]["once_s"] + max(
        (sum(seconds.get(r, slowest) for r in g) for g in groups), default=0.0)
    return hms(longest * MARGIN + MARGIN_MIN_S), longest


def hms(seconds: float) -> str:
    """SLURM's D-HH:MM:SS (HH:MM:SS under a day)."""
    s = int(math.ceil(seconds))
    days, s = divmod(s, 86400)
    text = f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{days}-{text}" if days else text


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def duration(seconds: float) -> str:
    return (f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min" if seconds < 7200
            else f"{seconds / 3600:.1f} h")


def render(result: dict, outputs: Path) -> str:
    """The plan in lines: a row per point, the total, the disk against the free space, slurm."""
    rows = [f"plan of {result['profile']}: {len(result['points'])} point(s) on {result['device']}"
            f", {result['per_device']} at once, {result['threads']} thread(s) each",
            f"{'point':<28} {'rows':>7} {'ep':>2} {'batch':>5} {'steps':>7} {'extra':>7} "
            f"{'tokens':>6} {'time':>9} {'memory':>9} {'disk':>9}"]
    for p in result["points"]:
        if "not_planned" in p:
            rows.append(f"{p['label']:<28} not planned ({p['not_planned']})")
            continue
        rows.append(f"{p['label']:<28} {p['train_rows']:>7} {p['epochs']:>2} "
                    f"{p['batch_size']:>5} {p['steps']:>7} {p['extra_examples']:>7} "
                    f"{p['tokens']:>6.0f} {duration(p['seconds']):>9} "
                    f"{size(p['memory_bytes']):>9} {size(p['disk_kept_bytes']):>9}")
    t, s = result["total"], result["slurm"]
    at_once = (f" ({s['points_at_once']} points at once)" if s.get("points_at_once", 1) > 1
               else "")
    free = shutil.disk_usage(costs.existing(outputs)).free
    counted = sorted({f"{p['label'].split()[0]}: {p['rows_from']}, {p['data']}"
                      for p in result["points"] if "rows_from" in p})
    rows += [f"total: {t['runs']} run(s), {t['steps']} steps, {duration(t['seconds'])} "
             f"({t['device_hours']:.2f} device-hours), peak "
             f"memory {size(t['memory_bytes'])}; disk kept {size(t['disk_kept_bytes'])}, needed "
             f"{size(t['disk_needed_bytes'])} with the runs in flight (free in {outputs}: "
             f"{size(free)})" + (f"; {t['k_note']}" if t.get("k_note") else ""),
             f"batch: {duration(t['once_s'])} once (start-up, the kernel, the tables and "
             f"report), {result['batch']['per_point_s']:.1f} s a point around its run",
             f"slurm: --time {s['time']} (the longest of {s['tasks']} task(s), "
             f"{duration(s['longest_task_s'])}, {s['margin']}), --mem {s['mem']}{at_once}, "
             f"{s['gpus_per_task']} GPU(s) a task",
             "rows: " + "; ".join(counted),
             "extra: SSA / BERT-mask's masked variants (gamma a row; SSA counts every row kept)"]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./run_all.sh plan", description=__doc__.splitlines()[0])
    parser.add_argument("profile", help="a name in params/ or a YAML path")
    parser.add_argument("--only", action="append", default=[], metavar="KEY=V1,V2",
                        help="only the grid's points whose KEY is one of the values (repeatable)")
    parser.add_argument("--per-device", type=int, metavar="K", help="K points at once (default: "
                        "the profile's per_device)")
    parser.add_argument("--budget", type=float, default=3.0, metavar="S",
                        help="seconds of probing per distinct step x length class (default 3)")
    parser.add_argument("--json", action="store_true", help="the plan as JSON")
    parser.add_argument("--outputs", default=str(outputs_root()))
    args = parser.parse_args(argv)
    if args.per_device is not None and args.per_device < 1:
        parser.error("--per-device must be >= 1")
    try:
        profile = load_profile(args.profile, args.outputs, args.only)
        result = plan(profile, args.per_device or profile.per_device, args.budget)
        result["made"] = datetime.now().astimezone().isoformat(timespec="seconds")
        kept = saved_path(profile, Path(args.outputs))
        kept.parent.mkdir(parents=True, exist_ok=True)
        kio.write_json(kept, result)
    except (ConfigError, DataError, ModelError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1) if args.json else render(result, Path(args.outputs))
          + f"\nsaved: {kept} (./run_all.sh slurm without --time takes its --time from it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
