"""The text a masked-LM pretraining run (method mlm, kit.train.pretrain) reads.

Text: the task's train split through the task's own reader (GLUE TSVs, a CSV's text columns
with or without a target, the synthetic task), capped by max_train_examples; with
`pretrain_eval_text` also the dev and test splits' text, labels unused (Kaggle's ITPT). The dev
text is the held-out set whose masked-LM loss is reported per epoch. Blank rows are dropped (no
token to mask); a task left with no text is one DataError line, in the batch's pre-flight.

No torch here: a batch's pre-flight checks this text before any kernel starts.
"""
from __future__ import annotations

from dataclasses import dataclass

from kit.config.run_config import RunConfig
from kit.config.tasks import Split, Task
from kit.data.pipeline import load_task_data
from kit.data.readers import DataError


@dataclass
class PretrainText:
    task: Task
    train: list[Split]              # trained on: train (+ dev and test with pretrain_eval_text)
    heldout: list[Split]            # the dev split(s): the held-out masked-LM loss

    def rows(self) -> dict[str, int]:
        return {"train_rows": sum(map(len, self.train)),
                "heldout_rows": sum(map(len, self.heldout))}


def load_text(cfg: RunConfig) -> PretrainText:
    """The run's text (see the module docstring); DataError when a part has none."""
    data = load_task_data(cfg)
    columns = cfg.csv_text_columns if data.task.kind == "csv" else data.task.text_columns
    extra = [*data.dev.values(), *data.test.values()] if cfg.pretrain_eval_text else []
    train = [with_text(split, columns) for split in [data.train, *extra]]
    return PretrainText(data.task, train,
                        [with_text(split, columns) for split in data.dev.values()])


def with_text(split: Split, columns) -> Split:
    """The rows of `split` with some text; a split with none is an error naming its columns."""
    texts = [split.text_a] + ([] if split.text_b is None else [split.text_b])
    keep = [i for i, row in enumerate(zip(*texts)) if any(t.strip() for t in row)]
    if not keep:
        raise DataError(f"{split.source}: no text to pretrain on in column(s) "
                        f"{', '.join(map(repr, columns))} ({len(split)} rows, all empty)")
    return split if len(keep) == len(split) else split.subset(keep)
