"""SSA hybrid: SSA co-training, and the sentence vector mixes the pooled [CLS] with the tokens
weighted by their predicted importance (kit.models.hybrid_weights)."""
from kit.methods.base import Method

METHOD = Method("ssa-h", "SSA-H", "tab:red", "o", epoch="ssa-labels", token_head=True,
                hybrid=True, paper_name="BERT-SSA-H")
