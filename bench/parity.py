"""Accuracy parity of two arms of one setting, from a parity profile's runs: bf16 vs fp32
(`mixed_precision`, the bf16-parity profile) or the packed dropout mask vs torch's
(`dropout_rng`, the dropout-parity profile).

    python -m kit.batch bf16-parity --outputs /tmp/parity-outputs
    python bench/parity.py /tmp/parity-outputs --json outputs/bench/bf16_parity.json
    python bench/parity.py /tmp/dp --profile dropout-parity --factor dropout_rng

Per task x method: best dev score mean ± std over seeds in each arm, Welch's p
(kit.results.frame.stats.welch_test), the mean paired difference; for SSA runs the label statistics
of the probed epochs (flip rate, share of label 1); and the paired speed ratios (train examples/s,
label generation, evaluation) of the two arms of a point. Only runs with status ok count; a
(task, method, seed) point counts only when both arms finished, so the means are paired.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

# the setting each parity compares (a field of metrics.json): its two values, first the arm
# under test, each with the name the tables give it
ARMS = {"mixed_precision": {"bf16": "bf16", "no": "fp32"},
        "dropout_rng": {"packed": "packed", "torch": "torch"}}


def load_runs(outputs: Path, profile: str, factor: str = "mixed_precision") -> dict:
    """{(task, method, seed): {arm: metrics}} of the profile's finished runs, both arms present."""
    points: dict = defaultdict(dict)
    for path in sorted(outputs.glob("runs/*/metrics.json")):
        m = json.loads(path.read_text())
        if m.get("status") == "ok" and m.get("profile") == profile:
            points[(m["task"], m["method"], m["seed"])][m[factor]] = m
    return {k: v for k, v in points.items() if all(a in v for a in ARMS[factor])}


def label_stats(m: dict) -> dict:
    """Flip rate and share of label 1 over the run's probed epochs (pooled counts)."""
    probed = [s for s in m["ssa_labels"] if "probed" in s and not s.get("reused")]
    if not probed:
        return {}
    variants = sum(s["variants"] for s in probed)
    tokens = sum(s["labelled_tokens"] for s in probed)
    return {"flip_rate": sum(s["flipped"] for s in probed) / max(variants, 1),
            "share_label1": sum(s["share_label1"] * s["labelled_tokens"] for s in probed)
            / max(tokens, 1)}


def mean_std(values) -> str:
    values = np.asarray(values, dtype=float)
    return f"{values.mean():.4f} ± {values.std(ddof=1) if len(values) > 1 else 0:.4f}"


def summarize(points: dict, factor: str = "mixed_precision") -> list[dict]:
    from kit.results.frame.stats import welch_test
    (a, la), (b, lb) = ARMS[factor].items()
    cells: dict = defaultdict(list)
    for (task, method, seed), runs in sorted(points.items()):
        cells[(task, method)].append(runs)
    rows = []
    for (task, method), pairs in cells.items():
        def ratio(get):       # arm a over arm b, per seed
            return [get(r[a]) / get(r[b]) for r in pairs]
        score = {arm: [r[arm]["best_dev"]["score"] for r in pairs] for arm in (a, b)}
        labels = {arm: [label_stats(r[arm]) for r in pairs] for arm in (a, b)}
        row = {"task": task, "method": method, "seeds": [r[a]["seed"] for r in pairs],
               f"score_{la}": score[a], f"score_{lb}": score[b],
               "welch_p": welch_test(score[a], score[b]),
               "mean_diff": float(np.mean(np.subtract(score[a], score[b]))),
               f"train_speed_{la}_over_{lb}": ratio(lambda m: m["train_examples_per_s"]),
               f"eval_time_{la}_over_{lb}": ratio(lambda m: m["wall_s"]["eval"])}
        if labels[a][0]:
            row.update({f"{k}_{name}": [s[k] for s in labels[arm]]
                        for k in ("flip_rate", "share_label1")
                        for arm, name in ((a, la), (b, lb))})
            row[f"label_gen_time_{la}_over_{lb}"] = ratio(lambda m: m["wall_s"]["label_generation"])
        rows.append(row)
    return rows


def print_tables(rows: list[dict], factor: str = "mixed_precision") -> None:
    la, lb = ARMS[factor].values()
    print(common.markdown_table(
        ["task", "method", "seeds", f"dev score {la}", f"dev score {lb}",
         f"{la} - {lb} (paired)", "Welch p", f"flip rate {la}", f"flip rate {lb}",
         f"label-1 share {la}", f"label-1 share {lb}"],
        [[r["task"], r["method"], len(r["seeds"]), mean_std(r[f"score_{la}"]),
          mean_std(r[f"score_{lb}"]), f"{r['mean_diff']:+.4f}", round(r["welch_p"], 3),
          *(mean_std(r[k]) if k in r else None for k in (
              f"flip_rate_{la}", f"flip_rate_{lb}", f"share_label1_{la}", f"share_label1_{lb}"))]
         for r in rows]))
    print(f"\nspeed, {la} / {lb} of the same point (min - max over seeds):\n")
    print(common.markdown_table(
        ["task", "method", "train ex/s", "eval time", "label generation time"],
        [[r["task"], r["method"], *(f"{min(r[k]):.2f} - {max(r[k]):.2f}" if k in r else None
                                    for k in (f"train_speed_{la}_over_{lb}",
                                              f"eval_time_{la}_over_{lb}",
                                              f"label_gen_time_{la}_over_{lb}"))]
         for r in rows]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outputs", help="the --outputs folder the profile ran into")
    parser.add_argument("--profile", default="bf16-parity")
    parser.add_argument("--factor", choices=list(ARMS), default="mixed_precision",
                        help="the setting the profile's two arms differ in")
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args()
    rows = summarize(load_runs(Path(args.outputs), args.profile, args.factor), args.factor)
    if not rows:
        raise SystemExit(f"no finished {' / '.join(ARMS[args.factor].values())} pairs of profile "
                         f"{args.profile} under {args.outputs}/runs")
    print_tables(rows, args.factor)
    common.dump_json(args.json, {"outputs": args.outputs, "rows": rows})


if __name__ == "__main__":
    main()
