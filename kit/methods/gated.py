"""Gated-BERT: EmBERT plus gated low-rank task adapters on the last layer's Q/K (stages: adapters,
gate, frozen base Q/K/V; kit.multitask_models)."""
from kit.methods.base import Method

METHOD = Method("gated", "Gated-BERT", "tab:purple", "P", multitask=True, gated=True)
