"""AdamW parameter groups: layer-wise learning-rate decay, no decay on biases and norms, and
freezing of the lowest backbone modules (StructBERT's `lr_decay_factor` and layer freezing)."""
from __future__ import annotations

from torch import nn

# Substrings of parameter names that get no weight decay (biases, LayerNorm / other norms).
NO_DECAY = ("bias", "LayerNorm.weight", "layer_norm", "norm.weight")


def backbone_depths(model: nn.Module) -> tuple[dict[int, int], int]:
    """Depth of each backbone parameter (by id): embeddings 0, encoder layer i -> i + 1.
    Everything else (pooler, heads) is at the top, depth L + 1. Returns (depths, L)."""
    backbone = getattr(model, "backbone", None)
    if backbone is None or not hasattr(backbone, "embeddings") or not hasattr(backbone, "encoder"):
        raise ValueError("parameter_groups needs model.backbone with .embeddings and "
                         ".encoder.layer (a Hugging Face BertModel or RobertaModel)")
    layers = backbone.encoder.layer
    depths = {id(p): 0 for p in backbone.embeddings.parameters()}
    for i, layer in enumerate(layers):
        depths.update({id(p): i + 1 for p in layer.parameters()})
    return depths, len(layers)


def parameter_groups(model: nn.Module, lr: float, weight_decay: float, layer_decay: float = 1.0,
                     freeze_layers: int = 0) -> list[dict]:
    """Param groups for torch.optim.AdamW; each group also has a "name" for logging.

    lr: heads and pooler get `lr`; encoder layer i of L gets lr * layer_decay ** (L - i);
        the embeddings get lr * layer_decay ** (L + 1). layer_decay=1 is a single lr.
    freeze_layers=N: the N lowest backbone modules, counting the embeddings as the first, get
        requires_grad=False and join no group: 1 = embeddings, 2 = embeddings + layer 0, ...,
        L + 1 = the whole encoder (pooler and heads still train).
    Parameters already frozen by the caller are left out too; every trainable parameter is
    in exactly one group.
    """
    depths, n_layers = backbone_depths(model)
    if not 0 < layer_decay <= 1:
        raise ValueError(f"layer_decay must be in (0, 1], got {layer_decay}")
    if not 0 <= freeze_layers <= n_layers + 1:
        raise ValueError(f"freeze_layers must be in 0..{n_layers + 1} (embeddings + {n_layers} "
                         f"layers), got {freeze_layers}")
    top = n_layers + 1
    # Names miss a LayerNorm inside e.g. nn.Sequential ("head.2.weight"): match the type too.
    norm_params = {id(p) for module in model.modules() if isinstance(module, nn.LayerNorm)
                   for p in module.parameters()}
    groups: dict[tuple[int, bool], dict] = {}
    for name, param in model.named_parameters():
        depth = depths.get(id(param), top)
        if depth < freeze_layers:
            param.requires_grad_(False)
        if not param.requires_grad:
            continue
        decay = id(param) not in norm_params and not any(key in name for key in NO_DECAY)
        group = groups.setdefault((depth, decay), {
            "name": f"{_depth_name(depth, top)}/{'decay' if decay else 'no_decay'}",
            "params": [],
            "lr": lr * layer_decay ** (top - depth),
            "weight_decay": weight_decay if decay else 0.0,
        })
        group["params"].append(param)
    return [groups[key] for key in sorted(groups)]


def _depth_name(depth: int, top: int) -> str:
    return "embeddings" if depth == 0 else "top" if depth == top else f"layer{depth - 1}"
