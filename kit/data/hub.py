"""GLUE from the Hugging Face hub's parquet copy (`nyu-mll/glue`), and whether the hub answers
at all (asked before `datasets` or `transformers` would retry for minutes offline); `fetch_task`
writes a task's splits as GLUE files (./run_all.sh fetch, on a networked machine)."""
from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from kit import io as kio
from kit.data.readers import (_LAYOUTS, GLUE_HINT, STSB_RANGE, DataError, check_glue_split,
                              check_targets, lacking, missing_files)
from kit.config.tasks import Split, Task

_HUB_DATASET = "nyu-mll/glue"
_HUB_TEXT = {"mnli": ("premise", "hypothesis")}   # other configs use the GLUE column names


def _hub_split_name(split: str) -> str:
    """Ours -> hub: dev -> validation, dev_matched -> validation_matched; train/test as is."""
    return "validation" + split.removeprefix("dev") if split.startswith("dev") else split


def hub_unreachable(timeout_s: float = 3.0) -> str | None:
    """Why the hub cannot be used right now, or None. Checked before calling `datasets`,
    which otherwise retries for minutes before failing offline."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
            return f"{var}={os.environ[var]} is set"
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        socket.create_connection((endpoint.hostname, port), timeout=timeout_s).close()
    except OSError as err:
        return f"cannot connect to {endpoint.hostname}:{port} ({err})"
    return None


def _hub_label_strings(task: Task, label_names: Sequence[str] | None) -> tuple[str, ...]:
    """Our label string for each hub class id.

    Where the hub's class names are our label strings (MNLI, QNLI, RTE) map by name: the hub
    orders MNLI entailment, neutral, contradiction. Elsewhere (CoLA, SST-2, MRPC, QQP, WNLI)
    the hub names the classes in words, but the GLUE files write the hub's class id itself.
    """
    if label_names and set(label_names) <= set(task.labels):
        return tuple(label_names)
    if task.labels == tuple(str(i) for i in range(len(task.labels))):
        return task.labels
    raise DataError(f"{task.name}: cannot match the hub's classes {list(label_names or [])} to "
                    f"the task's labels {list(task.labels)}; read the GLUE files instead: "
                    f"{GLUE_HINT}")


def split_from_hub(task: Task, data: Mapping[str, Sequence], label_names: Sequence[str] | None,
                   source: str) -> Split:
    """Convert one hub split (a `datasets.Dataset` or a dict of columns) into a `Split`.

    `label_names` are the hub's class names in hub id order (`features["label"].names`);
    None for STS-B. The hub marks hidden test labels with -1: those give labels None.
    """
    columns = _HUB_TEXT.get(task.hub_config, task.text_columns)
    hub_labels = np.asarray(list(data["label"]))

    def where(i: int) -> str:
        return f"{source}: row {i}"

    labels = None
    if not (hub_labels == -1).all():
        if task.regression:
            labels = check_targets(hub_labels.astype(np.float64), "label", where, STSB_RANGE)
        else:
            table = np.array([task.labels.index(s) for s in _hub_label_strings(task, label_names)])
            bad = (hub_labels < 0) | (hub_labels >= len(table))
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise DataError(f"{where(i)}: hub label id {hub_labels[i]} is outside 0.."
                                f"{len(table) - 1}; read the GLUE files instead: {GLUE_HINT}")
            labels = table[hub_labels.astype(np.int64)]
    return Split(
        text_a=list(data[columns[0]]),
        text_b=list(data[columns[1]]) if len(columns) > 1 else None,
        labels=labels, ids=[str(i) for i in data["idx"]], source=source)


def read_hub_split(task: Task, split: str) -> Split:
    """Load one GLUE split from the hub's parquet copy (`nyu-mll/glue`); needs the network.

    Fails fast with a DataError when offline (HF_HUB_OFFLINE set or hub unreachable).
    """
    check_glue_split(task, split)
    reason = hub_unreachable()
    if reason:
        raise DataError(f"the Hugging Face hub is unreachable ({reason}), so GLUE {task.name} "
                        f"cannot be downloaded; use a local copy of GLUE: {GLUE_HINT}")
    from datasets import load_dataset   # heavy import, only once the hub is really used
    return load_hub_split(task, _hub_split_name(split), load_dataset,
                          f"; use a local copy of GLUE: {GLUE_HINT}")


def load_hub_split(task: Task, hub_split: str, load, hint: str = "") -> Split:
    """One split of a task from the hub through `load` (datasets.load_dataset), as a Split;
    a failure to load is one DataError line naming the source (`hint` appended)."""
    source = f"hf://datasets/{_HUB_DATASET}/{task.hub_config}/{hub_split}"
    try:
        data = load(_HUB_DATASET, task.hub_config, split=hub_split)
    except Exception as err:  # network, auth, cache: whatever it is, say it in one line
        raise DataError(f"{source}: loading from the hub failed ({type(err).__name__}: {err})"
                        f"{hint}") from err
    return split_from_hub(task, data, getattr(data.features["label"], "names", None), source)


# ---------------------------------------------------------------- fetch: the hub into GLUE files

def glue_tsv(task: Task, split: str, data: Split) -> str:
    """A split as the GLUE file kit.data.readers reads back: CoLA's train and dev without a
    header (source, label, judgement, sentence), every other file with `index`, the text
    columns and (not in test files) the label column, labels as the task's label strings.
    Tabs and line breaks inside a text become spaces (GLUE's fields hold none)."""
    layout = _LAYOUTS[task.name]
    clean = lambda text: " ".join(str(text).replace("\t", " ").splitlines())  # noqa: E731
    test = split in task.test_splits or data.labels is None
    texts = [data.text_a] + ([data.text_b] if data.text_b is not None else [])
    labels = [] if test else [label_text(task, v) for v in data.labels]
    if layout.no_header and not test:            # CoLA's raw cola_public files
        lines = [f"hub\t{y}\t\t{clean(a)}" for a, y in zip(data.text_a, labels)]
    else:
        header = ["index", *layout.text, *([] if test else [layout.label])]
        lines = ["\t".join(header)] + [
            "\t".join([str(i), *(clean(t[row]) for t in texts), *([] if test else [labels[row]])])
            for row, i in enumerate(data.ids)]
    return "\n".join(lines) + "\n"


def label_text(task: Task, value) -> str:
    """A label as the GLUE files write it: a class's string, STS-B's score."""
    return f"{float(value):.7g}" if task.regression else task.labels[int(value)]


def fetch_task(task: Task, folder: Path, load=None) -> dict[str, int] | None:
    """The GLUE files of `task` that folder/<TASK>/ lacks (kit.data.readers.missing_files: every
    split, where the folder is absent) from the hub (`load`: datasets.load_dataset); {split:
    rows} written, None where the task is there whole. Every lacking split is loaded before
    any is written, and written into a folder beside, then moved in (kit.io.files_into): an
    interruption leaves the task as it was, never half of one release; the files already
    there are never touched."""
    target = folder / task.name
    lack = missing_files(folder, task)
    if not lack:
        return None
    in_the_way = [target] if target.exists() and not target.is_dir() else [
        p for p in lack if p.exists()]
    if in_the_way:
        raise DataError(f"{lacking(in_the_way)}: where fetch writes {task.name}'s GLUE files; "
                        "move it away and fetch again")
    if load is None:
        from datasets import load_dataset as load
    splits = {p.stem: load_hub_split(task, _hub_split_name(p.stem), load) for p in lack}
    try:
        with kio.files_into(target) as tmp:
            for split, data in splits.items():
                (tmp / f"{split}.tsv").write_text(glue_tsv(task, split, data), encoding="utf-8")
    except OSError as err:
        raise OSError(f"{target}: writing {', '.join(p.name for p in lack)} failed "
                      f"({err.strerror or err}); none was written, fetch again once that is "
                      "fixed") from None
    return {split: len(data) for split, data in splits.items()}
