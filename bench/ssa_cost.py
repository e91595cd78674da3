"""What SSA costs: full-run wall time of the kit's bert vs bert-mask vs ssa-h.

Same data and settings for every run; bert-mask and ssa-h at each --gammas value (ssa-h with
the kit's default label_merge). Every run is a fresh process with a fresh outputs folder; the
numbers come from the run's own metrics.json: wall_s (train / label_generation / eval / total),
train_examples_per_s, and from ssa_labels how many sentences were probed and masked variants
predicted, so probing throughput (forward passes/s, no gradients) can be set against training
throughput (forward + backward), and the share of a probing epoch that goes to probing.

    python bench/ssa_cost.py --task RTE --json outputs/bench/ssa_cost_rte.json
    python bench/ssa_cost.py --quick
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

# SSA starts probing at epoch 1 (ssa_start_epoch), so a quick run needs 2 epochs to show it
QUICK = {"task": "RTE", "max_train": 64, "epochs": 2, "gammas": "1.0"}   # 3 runs, ~2.5 min


def main() -> None:
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument("--gammas", default="0.6,1.0,2.0",
                        help="masked variants per sentence, for bert-mask and ssa-h")
    parser.add_argument("--methods", default="bert,bert-mask,ssa-h")
    parser.add_argument("--precisions", default="",
                        help="comma-separated mixed_precision values (e.g. bf16,no): every run "
                             "once per precision, alternated; empty = --precision only")
    args = common.parse(parser, QUICK)
    common.check_environment()
    if args.child:
        common.setup_child(args)
        name, _, precision = args.child.partition(":")
        method, _, gamma = name.partition("@")
        common.write_result(args.result, run_kit(args, method, float(gamma or 1.0),
                                                 precision or args.precision))
        return

    from kit.config.run_config import RunConfig
    start = RunConfig().ssa_start_epoch
    if args.epochs <= start:
        print(f"warning: with {args.epochs} epoch(s) nothing is probed: SSA starts at epoch "
              f"{start} (0-based); use --epochs {start + 1} or more", file=sys.stderr)
    meta = common.print_header("SSA cost")
    runs = {}
    for name in run_names(args):
        runs[name] = common.run_child(
            __file__, common.child_argv(args, ("gammas", "methods", "precisions")), name)
    rows = summarize(args, runs)
    common.dump_json(args.json, {**meta, "settings": vars(args), "runs": runs, "summary": rows})


def run_names(args) -> list[str]:
    """bert once (gamma does not touch it); the others once per gamma, as method@gamma; with
    --precisions each of them once per precision, as name:precision, precisions alternated
    within a run so a drifting load hits both alike."""
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    gammas = [g.strip() for g in args.gammas.split(",") if g.strip()]
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    names = [m if m == "bert" else f"{m}@{g}" for m in methods for g in (
        [None] if m == "bert" else gammas)]
    return [f"{n}:{p}" for n in names for p in precisions] if precisions else names


def run_kit(args, method: str, gamma: float, precision: str) -> dict:
    from kit.train.metrics import reported_metrics
    from kit.config.tasks import get_task
    from kit.train.finetune import fit
    with tempfile.TemporaryDirectory() as out:
        cfg = common.kit_config(args, out, method=method, gamma=gamma,
                                mixed_precision=precision)
        m = fit(cfg)
    metric = reported_metrics(get_task(args.task))[0]
    return {"method": method, "gamma": gamma, "label_merge": cfg.label_merge,
            "wall_s": m["wall_s"], "train_examples": m["train_examples"],
            "train_examples_per_s": m["train_examples_per_s"], "ssa_labels": m["ssa_labels"],
            "metric": metric, "dev_metric": m["last_dev"][metric], "device": m["device"],
            "precision": m["mixed_precision"]}


def probing(run: dict, epochs: int) -> dict:
    """Probing cost of one run from its label statistics (empty for bert and bert-mask,
    whose ssa_labels hold no probing)."""
    stats = [s for s in run["ssa_labels"] if "probed" in s and not s.get("reused")]
    if not stats:
        return {}
    forwards = sum(s["probed"] + s["variants"] for s in stats)   # one forward pass each
    probe_s = sum(s["wall_s"] for s in stats)
    per_probe_epoch = probe_s / len(stats)
    train_epoch = run["wall_s"]["train"] / epochs
    variants = sum(s["variants"] for s in stats)
    return {"probed": sum(s["probed"] for s in stats), "variants": variants,
            "probe_s": round(probe_s, 3), "probe_forwards_per_s": round(forwards / probe_s, 2),
            # of an epoch that probes: probing / (probing + that epoch's training)
            "probe_share_of_epoch": round(per_probe_epoch / (per_probe_epoch + train_epoch), 4),
            "flip_rate": round(sum(s["flipped"] for s in stats) / max(variants, 1), 4)}


def summarize(args, runs: dict) -> list[dict]:
    rows, table = [], []
    for name, r in runs.items():
        base = runs.get("bert" + name[len(name.partition(":")[0]):])   # bert, same precision
        w, p = r["wall_s"], probing(r, args.epochs)
        row = {"run": name, **w, "train_examples": r["train_examples"],
               "train_examples_per_s": r["train_examples_per_s"], **p,
               "total_vs_bert": common.ratio(w["total"], base and base["wall_s"]["total"]),
               "train_vs_bert": common.ratio(w["train"], base and base["wall_s"]["train"]),
               "probe_vs_train_speed": common.ratio(p.get("probe_forwards_per_s"),
                                                    r["train_examples_per_s"]),
               "memory_mb": common.memory_mb(r), "dev_metric": r["dev_metric"]}
        rows.append(row)
        table.append([name, w["train"], w["label_generation"], w["eval"], w["total"],
                      r["train_examples"], r["train_examples_per_s"],
                      p.get("probed", 0) + p.get("variants", 0) or None,
                      p.get("probe_forwards_per_s"), p.get("probe_share_of_epoch"),
                      row["total_vs_bert"], row["memory_mb"], r["dev_metric"]])
    metric = next(iter(runs.values()))["metric"]
    print(f"\n{args.task}, {args.max_train or 'all'} train rows, {args.epochs} epochs, batch "
          f"{args.batch_size}, max length {args.max_length}, lr {args.lr}, seed {args.seed}, "
          f"model {args.model}; walls in seconds\n")
    print(common.markdown_table(
        ["run", "train", "label gen", "eval", "total", "trained ex", "train ex/s",
         "probe fwds", "probe fwd/s", "probe share", "total / bert", "peak MB",
         f"dev {metric}"], table))
    print("\nprobe fwds: sentences probed + masked variants predicted (one forward pass each, "
          "no gradients); probe share: probing / (probing + training) of an epoch that probes")
    lines = precision_ratios(rows)
    if lines:
        print("\nratios between precisions of the same run (speed above 1: the first is "
              "faster):\n" + "\n".join(lines))
    return rows


def precision_ratios(rows: list[dict]) -> list[str]:
    """For runs measured in several precisions (name:precision): the first precision's training
    and probing speed and full-run time against each other's."""
    by_name: dict[str, dict[str, dict]] = {}
    for row in rows:
        name, _, precision = row["run"].partition(":")
        if precision:
            by_name.setdefault(name, {})[precision] = row
    lines = []
    for name, got in by_name.items():
        first, *others = list(got)
        for other in others:
            a, b = got[first], got[other]
            probe = common.ratio(a.get("probe_forwards_per_s"), b.get("probe_forwards_per_s"))
            lines.append(
                f"- {name}: {first} / {other}: train ex/s x"
                f"{common.ratio(a['train_examples_per_s'], b['train_examples_per_s'])}, probe "
                f"fwd/s x{probe}, total time x{common.ratio(a['total'], b['total'])}")
    return lines


if __name__ == "__main__":
    main()
