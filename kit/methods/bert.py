"""Vanilla fine-tuning: the paper's BERT-r baseline (pooled [CLS] -> dropout -> linear)."""
from kit.methods.base import Method

METHOD = Method("bert", "BERT-r", "tab:gray", "D", paper_name="BERT-r")
