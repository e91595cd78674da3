"""Masked-LM pretraining on a task's text (task-adaptive pretraining, TAPT; with the dev / test
text too, Kaggle's ITPT): no labels, no sentence head. Its run writes an adapted encoder that a
fine-tuning run takes as `model` (kit.pretrain)."""
from kit.methods.base import Method

METHOD = Method("mlm", "MLM (TAPT)", "tab:olive", "P", pretrain=True)
