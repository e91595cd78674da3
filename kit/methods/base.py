"""What a method is: its name, how tables and figures show it, and which of the kit's building
blocks it uses. Data only (no torch), so config, tables and figures read it for free."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    name: str                        # the `method` parameter
    label: str                       # tables and figure legends
    color: str                       # matplotlib colour of its lines and markers
    marker: str                      # matplotlib marker
    epoch: str = "plain"             # the epoch's examples: plain | masked-copies | ssa-labels
    token_head: bool = False         # an SSA token-importance head (trained on SSA labels)
    hybrid: bool = False             # SSA-H: the sentence vector mixes importance-weighted tokens
    multitask: bool = False          # several tasks, one head each (kit.multitask)
    gated: bool = False              # multi-task: Gated-BERT's adapters on the last layer
    pretrain: bool = False           # masked-LM pretraining on the task's text, no labels and
                                     # no sentence head (kit.pretrain: TAPT / ITPT)
    paper_name: str = ""             # its row name in the paper's tables, if it has one
