"""The SSA paper's published GLUE test-set numbers (Kou et al., Tables 2 and 3).

The rows are kept as the paper prints them (tab-separated, copied from the text) and parsed on
import, so checking them against the paper is a plain text comparison. Numbers are x100 as
printed. Note they are GLUE *test* scores of BERT-base/large and RoBERTa models, while the kit
measures dev scores, often of smaller backbones: compare gains over the baseline row, and read
absolute differences with that in mind.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from kit.train.metrics import reported_metrics
from kit.config.profiles import profile_path, read_spec
from kit.config.run_config import ConfigError
from kit.config.tasks import GLUE_TASKS

# Column order of the paper's tables (and of GLUE).
PAPER_TASKS = ("CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI")

# Rows as printed: "Model, Avg, CoLA ... WNLI"; pairs are F1/acc, pearson/spearman, m/mm.
# Each row is (printed name, kit method it corresponds to, the printed cells); the paper's tab
# separators are written " | " here, the cells are verbatim (spaces and marks included).
# The leaderboard "BERT" rows have no kit method: "BERT-r" is the paper's own reproduction.
_TABLES = {
    "base": [  # Table 2, BERT-base
        ("BERT", None,
         "78.3 | 52.1 | 93.5 | 88.9/84.8 | 87.1/85.8 | 71.2/89.2 | 84.6/83.4 | 90.5 | 66.4 | 65.1"),
        ("BERT-r", "bert",
         "78.4 | 51.8 | 94.0 | 87.1/82.8 | 86.9/86.0 | 71.0/89.1 | 84.2/83.2 | 90.5 | 69.1 | 65.1"),
        ("BERT-m", "bert-mask",
         "78.3 | 53.1 | 93.7 | 88.1/83.9 | 86.6/85.4 | 69.8/88.6 | 84.2/83.1 | 90.6 | 67.2 | 65.1"),
        ("BERT-SSA-Co", "ssa-co",
         "79.0 | 52.8 | 94.1 | 89.0/85.2 | 87.2/86.1 | 71.1/89.1 | 84.6/83.7 | 90.8 | 69.8 | 65.1"),
        ("BERT-SSA-H", "ssa-h",
         "79.3 | 54.1* | 94.4 | 89.1/85.4* | 87.2/86.3 | 71.5/89.3** | 84.7/84.1* | 91.3* | 70.3** | 65.1"),
    ],
    "large": [  # Table 3, BERT-large
        ("BERT", None,
         "80.5 | 60.5 | 94.9 | 89.3/85.4 | 87.6/86.5 | 72.1/89.3 | 86.7/85.9 | 92.7 | 70.1 | 65.1"),
        ("BERT-r", "bert",
         "80.5 | 60.2 | 94.9 | 89.2/85.3 | 87.6/86.5 | 72.1/89.4 | 86.5/85.9 | 92.8 | 70.1 | 65.1"),
        ("BERT-SSA-H", "ssa-h",
         "81.2 | 62.7 | 95.8 | 90.2/86.2 | 87.6/86.8 | 72.4/89.5 | 86.2/ 86.2 | 92.9 | 71.5 | 65.1"),
    ],
    "roberta-base": [  # Table 3, RoBERTa-base
        ("RoBERTa-r", "bert",
         "81.5 | 61.1 | 95.6 | 91.3/88.5 | 88.1/87.2 | 72.2/89.4 | 87.1/86.3 | 92.8 | 73.9 | 65.1"),
        ("RoBERTa-SSA-H", "ssa-h",
         "82.2 | 62.0 | 96.2 | 92.2/89.3 | 89.6/88.7 | 72.5/89.6 | 87.4/87.0 | 93.1 | 74.9 | 65.1"),
    ],
    "roberta-large": [  # Table 3, RoBERTa-large
        ("RoBERTa-r", "bert",
         "83.8 | 63.9 | 96.3 | 91.5/88.3 | 91.6/91.1 | 72.6/89.7 | 89.5/ 89.6 | 94.3 | 82.3 | 65.1"),
        # Printed "RoBERTa-bSSA-H" in the paper's text (a typo for RoBERTa-SSA-H).
        ("RoBERTa-SSA-H", "ssa-h",
         "84.3 | 64.9 | 96.8 | 92.6/90.2 | 91.8/91.2 | 73.5/90.0 | 89.7/89.5 | 94.6 | 82.9 | 65.1"),
    ],
}


@dataclass(frozen=True)
class PaperRow:
    name: str                      # row label as printed
    method: str | None             # the kit method it reproduces; None for leaderboard rows
    avg: float                     # the printed Avg
    values: dict[str, float]       # kit.train.metrics' name ("MNLI/accuracy_mm") -> x100
    marks: dict[str, str]          # task -> "*" / "**" as printed (significance vs BERT)
    text: str                      # the printed cells, " | "-separated, to check against the paper


def _parse(name: str, method: str | None, text: str) -> PaperRow:
    avg, *cells = text.split(" | ")
    values, marks = {}, {}
    for task_name, cell in zip(PAPER_TASKS, cells, strict=True):
        mark = re.search(r"\*+$", cell)
        marks[task_name] = mark.group() if mark else ""
        numbers = [float(x) for x in cell.rstrip("*").split("/")]
        metrics = reported_metrics(GLUE_TASKS[task_name])
        values.update({f"{task_name}/{m}": v for m, v in zip(metrics, numbers, strict=True)})
    return PaperRow(name, method, float(avg), values, marks, text)


PAPER_RESULTS: dict[str, list[PaperRow]] = {
    table: [_parse(*row) for row in rows] for table, rows in _TABLES.items()}


def paper_row(table: str, method: str) -> PaperRow | None:
    """The paper's row for a kit method in one table ("base", "large", "roberta-base",
    "roberta-large"), or None when the paper has no such row (e.g. SSA-Co in Table 3)."""
    if table not in PAPER_RESULTS:
        raise ValueError(f"unknown paper table {table!r}: choose one of {list(PAPER_RESULTS)}")
    return next((row for row in PAPER_RESULTS[table] if row.method == method), None)


def profile_paper(profile: str | None) -> str:
    """The paper's table a profile compares with: its `paper:` key (kit.config.profiles: base,
    large, roberta-base, roberta-large, auto, none), so a copy of a paper profile under another
    name keeps the paper's rows; "none" for no profile, an unknown one, or one without the key."""
    if not profile:
        return "none"
    try:
        return str(read_spec(profile_path(str(profile))).get("paper", "none"))
    except ConfigError:
        return "none"


def paper_profile(profile: str | None) -> bool:
    """Whether a profile (a name in params/ or a YAML path) asks for the paper's rows."""
    return profile_paper(profile) != "none"
