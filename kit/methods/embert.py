"""EmBERT: several tasks trained together, a learned task embedding added to every layer's
Q/K/V (kit.multitask_models), one head per task."""
from kit.methods.base import Method

METHOD = Method("embert", "EmBERT", "tab:green", "v", multitask=True)
