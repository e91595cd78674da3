"""bf16 vs fp32 accuracy parity, from the runs of the bf16-parity profile.

    python -m kit.batch bf16-parity --outputs /tmp/parity-outputs
    python bench/bf16_parity.py /tmp/parity-outputs --json outputs/bench/bf16_parity.json

Per task x method: best dev score mean ± std over seeds in each precision, Welch's p
(kit.results.stats.welch_test), the mean paired difference; for SSA runs the label statistics of the
probed epochs (flip rate, share of label 1); and the paired speed ratios (train examples/s,
label generation, evaluation) of runs that ran back to back. Only runs with status ok count; a
(task, method, seed) point counts only when both precisions finished, so the means are paired.
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

PRECISIONS = ("bf16", "no")


def load_runs(outputs: Path, profile: str) -> dict:
    """{(task, method, seed): {precision: metrics}} of the profile's finished runs."""
    points: dict = defaultdict(dict)
    for path in sorted(outputs.glob("runs/*/metrics.json")):
        m = json.loads(path.read_text())
        if m.get("status") == "ok" and m.get("profile") == profile:
            points[(m["task"], m["method"], m["seed"])][m["mixed_precision"]] = m
    return {k: v for k, v in points.items() if all(p in v for p in PRECISIONS)}


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


def summarize(points: dict) -> list[dict]:
    from kit.results.stats import welch_test
    cells: dict = defaultdict(list)
    for (task, method, seed), runs in sorted(points.items()):
        cells[(task, method)].append(runs)
    rows = []
    for (task, method), pairs in cells.items():
        score = {p: [r[p]["best_dev"]["score"] for r in pairs] for p in PRECISIONS}
        labels = {p: [label_stats(r[p]) for r in pairs] for p in PRECISIONS}
        speed = {k: [r["bf16"][k][w] / r["no"][k][w] if k == "wall_s" else
                     r["bf16"][k] / r["no"][k] for r in pairs]
                 for k, w in (("train_examples_per_s", None), ("wall_s", "label_generation"))
                 if all(r["no"].get(k) for r in pairs)}
        row = {"task": task, "method": method, "seeds": [r["bf16"]["seed"] for r in pairs],
               "score_bf16": score["bf16"], "score_fp32": score["no"],
               "welch_p": welch_test(score["bf16"], score["no"]),
               "mean_diff": float(np.mean(np.subtract(score["bf16"], score["no"]))),
               "train_speed_bf16_over_fp32": speed["train_examples_per_s"],
               "eval_time_bf16_over_fp32": [r["bf16"]["wall_s"]["eval"] / r["no"]["wall_s"]["eval"]
                                            for r in pairs]}
        if labels["bf16"][0]:
            row.update({f"{k}_{p}": [s[k] for s in labels[q]] for k in ("flip_rate", "share_label1")
                        for p, q in (("bf16", "bf16"), ("fp32", "no"))})
            row["label_gen_time_bf16_over_fp32"] = [
                r["bf16"]["wall_s"]["label_generation"] / r["no"]["wall_s"]["label_generation"]
                for r in pairs]
        rows.append(row)
    return rows


def print_tables(rows: list[dict]) -> None:
    print(common.markdown_table(
        ["task", "method", "seeds", "dev score bf16", "dev score fp32", "bf16 - fp32 (paired)",
         "Welch p", "flip rate bf16", "flip rate fp32", "label-1 share bf16",
         "label-1 share fp32"],
        [[r["task"], r["method"], len(r["seeds"]), mean_std(r["score_bf16"]),
          mean_std(r["score_fp32"]), f"{r['mean_diff']:+.4f}", round(r["welch_p"], 3),
          *(mean_std(r[k]) if k in r else None for k in (
              "flip_rate_bf16", "flip_rate_fp32", "share_label1_bf16", "share_label1_fp32"))]
         for r in rows]))
    print("\nspeed, bf16 / fp32 of the same point (runs back to back; min - max over seeds):\n")
    print(common.markdown_table(
        ["task", "method", "train ex/s", "eval time", "label generation time"],
        [[r["task"], r["method"], *(f"{min(r[k]):.2f} - {max(r[k]):.2f}" if k in r else None
                                    for k in ("train_speed_bf16_over_fp32",
                                              "eval_time_bf16_over_fp32",
                                              "label_gen_time_bf16_over_fp32"))]
         for r in rows]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outputs", help="the --outputs folder the profile ran into")
    parser.add_argument("--profile", default="bf16-parity")
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args()
    rows = summarize(load_runs(Path(args.outputs), args.profile))
    if not rows:
        raise SystemExit(f"no finished bf16 / fp32 pairs of profile {args.profile} under "
                         f"{args.outputs}/runs")
    print_tables(rows)
    common.dump_json(args.json, {"outputs": args.outputs, "rows": rows})


if __name__ == "__main__":
    main()
