"""The method registry: one file per method in this folder, each defining METHOD (a
kit.methods.base.Method), listed once below. Everything else asks the registry (`get`, `names`,
the flags) instead of testing method names. docs/architecture.md: adding a method."""
from __future__ import annotations

from kit.methods import bert, bert_mask, embert, gated, mlm, ssa_co, ssa_h
from kit.methods.base import Method

REGISTRY: dict[str, Method] = {m.METHOD.name: m.METHOD
                               for m in (bert, bert_mask, ssa_co, ssa_h, embert, gated, mlm)}


def get(name: str) -> Method:
    """The method called `name` (KeyError for an unknown one: RunConfig validates names first)."""
    return REGISTRY[name]


def names(**flags) -> tuple[str, ...]:
    """Method names in registry order, those whose flags equal `flags` (e.g. multitask=True)."""
    return tuple(n for n, m in REGISTRY.items()
                 if all(getattr(m, k) == v for k, v in flags.items()))
