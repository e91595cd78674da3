"""BERT-mask: each epoch adds gamma randomly masked copies of the training sentences (the paper's
augmentation baseline; kit.ssa.build_epoch, epoch "masked-copies")."""
from kit.methods.base import Method

METHOD = Method("bert-mask", "BERT-mask", "tab:orange", "s", epoch="masked-copies",
                paper_name="BERT-m")
