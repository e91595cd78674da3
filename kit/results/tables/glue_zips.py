"""GLUE server submissions from runs' test predictions: one zip per system.

`build_submissions` groups runs (by default per model x method x seed: one "system" each), checks
every file (kit.results.tables.submission.read_test_predictions; row counts against the GLUE
test sets) and writes `outputs/submissions/<profile>-<method>-s<seed>.zip` atomically (kit.io),
one file per task at the zip's root, plus a manifest (`<profile>-manifest.csv`) saying what each
zip holds and lacks. AX.tsv (the diagnostic set, predicted with an MNLI model) is not produced
by the kit: every manifest notes its absence. Reads only outputs/ (no torch).
"""
from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from kit import io as kio
from kit.config.paths import outputs_root
from kit.config.tasks import GLUE_TASKS, get_task
from kit.results.tables.submission import (GLUE_TEST_ROWS, HEADER, SUBMISSION_FILES,
                                           SubmissionError, read_test_predictions)
from kit.runs import predictions_dir

AX_NOTE = "AX.tsv (diagnostic set) not produced by the kit: add it by hand if wanted"


def submission_text(frame: pd.DataFrame) -> str:
    return "\n".join(["\t".join(HEADER), *(f"{i}\t{p}" for i, p in
                                          zip(frame["index"], frame["prediction"]))]) + "\n"


def write_zip(files: dict[str, str], path: str | os.PathLike) -> Path:
    """A zip with `files` ({name: text}) at its root, written atomically."""
    path = Path(path)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(files):
            zf.writestr(name, files[name])
    with kio.atomic_path(path) as tmp:
        tmp.write_bytes(buffer.getvalue())
    return path


def glue_name(task) -> str | None:
    """The canonical GLUE name of a run's task (`rte`, `sst2` ... -> RTE, SST-2), else None."""
    try:
        name = get_task(str(task)).name
    except ValueError:
        return None
    return name if name in GLUE_TASKS else None


def _slug(value) -> str:
    return str(value).replace("/", "_").replace(" ", "_")


def _zip_name(prefix: str, key: dict, several_models: bool) -> str:
    parts = [prefix] if prefix else []
    if several_models and "model" in key:
        parts.append(_slug(key["model"]))
    parts += [_slug(v) if k != "seed" else f"s{v}" for k, v in key.items() if k != "model"]
    return "-".join(parts) + ".zip"


def build_submissions(runs: pd.DataFrame, outputs_dir: str | os.PathLike = "outputs",
                      profile: str | None = None,
                      group_by: Sequence[str] = ("model", "method", "seed"),
                      strict: bool = False) -> pd.DataFrame:
    """One GLUE submission zip per group of finished runs that wrote test predictions.

    `runs` is a `kit.results.frame.collect.collect_runs` frame holding one configuration per task
    and group (select one first, e.g. `selection.select_runs`, when a grid varies hyper-parameters).
    Zips go to `<outputs_dir>/submissions/<profile>-<method>-s<seed>.zip` (the model's name is added
    when `runs` holds several models); `<profile>-manifest.csv` lists, per zip, each file with
    its run, rows and the GLUE test-set rows, and the files it lacks (the GLUE server expects
    all of them). A row count that differs from the GLUE test set is a note, or an error with
    `strict=True` (a complete submission must match). Returns the manifest (empty when no run
    has test predictions).
    """
    group_by = list(group_by)
    prefix = Path(profile).stem if profile else "runs"
    columns = ["zip", *group_by, "file", "task", "run_id", "rows", "glue_rows", "note"]
    ok = runs[runs["status"] == "ok"] if len(runs) else runs
    if len(ok):
        ok = ok.assign(glue_task=ok["task"].map(glue_name)).dropna(subset=["glue_task"])
    out_dir = outputs_root(outputs_dir) / "submissions"
    manifest = []
    several_models = len(ok) > 0 and ok["model"].nunique() > 1
    for key_values, group in (ok.groupby(group_by, sort=True) if len(ok) else []):
        key = dict(zip(group_by, key_values if isinstance(key_values, tuple) else (key_values,)))
        dup = group["glue_task"].duplicated(keep=False)
        if dup.any():
            raise SubmissionError(
                f"{key}: several finished runs of {group['glue_task'][dup].iloc[0]}: select one "
                f"configuration per task first (kit.results.tables.selection.select_runs)")
        files, rows = {}, []
        for _, run in group.iterrows():
            run_dir = Path(run["run_dir"])
            for (task_name, split), name in SUBMISSION_FILES.items():
                # a multi-task run (one row per task) keeps each task's files in a subfolder
                path = next((p for p in (predictions_dir(run_dir, task_name) / f"{split}.tsv",
                                         predictions_dir(run_dir) / f"{split}.tsv")
                             if p.exists()), None)
                if task_name != run["glue_task"] or path is None:
                    continue
                frame = read_test_predictions(path, task_name)
                note = ""
                if len(frame) != GLUE_TEST_ROWS[name]:
                    note = f"{len(frame)} rows, the GLUE test set has {GLUE_TEST_ROWS[name]}"
                    if strict:
                        raise SubmissionError(f"{path}: {note}")
                files[name] = submission_text(frame)
                rows.append({**key, "file": name, "task": task_name, "run_id": run["run_id"],
                             "rows": len(frame), "glue_rows": GLUE_TEST_ROWS[name],
                             "note": note})
        if not files:
            continue                        # no run of this group predicted the test sets
        zip_name = _zip_name(prefix, key, several_models)
        write_zip(files, out_dir / zip_name)
        lacking = [n for n in SUBMISSION_FILES.values() if n not in files]
        rows.append({**key, "file": "", "task": "", "run_id": "", "rows": None,
                     "glue_rows": None, "note": (f"missing: {', '.join(lacking)}; " if lacking
                                                 else "") + AX_NOTE})
        manifest += [{"zip": zip_name, **r} for r in rows]
    table = pd.DataFrame(manifest, columns=columns)
    if len(table):
        kio.write_text(out_dir / f"{prefix}-manifest.csv", table.to_csv(index=False))
    return table
