"""AdamW parameter groups: layer-wise learning-rate decay, no decay on biases and norms, and
freezing of the lowest backbone modules (StructBERT's `lr_decay_factor` and layer freezing).
The layer stack is found in any encoder family (`layer_stack`), not by a BERT-only path."""
from __future__ import annotations

from torch import nn

from kit.train.checkpoint_hardware import CheckpointError   # run_state's, whose refusals these join

# Substrings of parameter names that get no weight decay (biases, LayerNorm / other norms).
NO_DECAY = ("bias", "LayerNorm.weight", "layer_norm", "norm.weight")


def layer_stack(backbone: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """(name, modules) of the encoder's layer stack: the first nn.ModuleList (in module order)
    holding as many blocks as the config's num_hidden_layers - BERT/RoBERTa/ELECTRA/DeBERTa
    `encoder.layer`, DistilBERT `transformer.layer`, ModernBERT `layers`. None if there is none."""
    n_layers = getattr(getattr(backbone, "config", None), "num_hidden_layers", None)
    for name, module in backbone.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) and len(module) == n_layers:
            return name, module
    return None


def backbone_depths(model: nn.Module) -> tuple[dict[int, int], int]:
    """Depth of each backbone parameter (by id): input side 0, encoder layer i -> i + 1.
    Input side = what the backbone registers before its layer stack (the embeddings, ELECTRA's
    embedding projection) and the stack container's own parameters (DeBERTa's relative
    position table and its norm, shared by every layer). Parameters missing from the result
    (pooler, ModernBERT's final norm, heads) are at the top, depth L + 1. Returns (depths, L).
    Raises ValueError when the backbone has no recognisable layer stack."""
    backbone = getattr(model, "backbone", None)
    if backbone is None:
        raise ValueError("parameter_groups needs a model with a .backbone (the encoder)")
    found = layer_stack(backbone)
    if found is None:
        raise ValueError(f"{type(backbone).__name__}: no layer stack found (an nn.ModuleList of "
                         "num_hidden_layers blocks); layer_decay and freeze_layers need one")
    stack_name, layers = found
    depths = {}
    for i, layer in enumerate(layers):
        depths.update({id(p): i + 1 for p in layer.parameters()})
    container = stack_name.rsplit(".", 1)[0] if "." in stack_name else ""
    top_child = stack_name.split(".", 1)[0]
    for name, child in backbone.named_children():
        if name == top_child:
            break
        depths.update({id(p): 0 for p in child.parameters()})
    if container:
        depths.update({id(p): 0 for p in backbone.get_submodule(container).parameters()
                       if id(p) not in depths})
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
    in exactly one group. A backbone without a recognisable layer stack trains with one lr
    when layer_decay is 1 and nothing is frozen; otherwise it is a ValueError.
    """
    if not 0 < layer_decay <= 1:
        raise ValueError(f"layer_decay must be in (0, 1], got {layer_decay}")
    if not hasattr(model, "backbone"):
        raise ValueError("parameter_groups needs a model with a .backbone (the encoder)")
    try:
        depths, n_layers = backbone_depths(model)
    except ValueError:
        if layer_decay != 1 or freeze_layers != 0:
            raise
        depths, n_layers = {}, 0      # no layer stack: nothing to decay or freeze, one lr
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


def merged_groups(groups: list[dict]) -> list[dict]:
    """`groups` with those of equal settings (lr, weight_decay) joined, in order of first
    appearance: with layer_decay 1 the per-depth groups are two (decay, no decay). A fused
    AdamW step launches its kernels per group, and every parameter's update is its own
    (elementwise, the group's settings), so joining changes no value, only the launch count."""
    merged: dict[tuple[float, float], dict] = {}
    for group in groups:
        key = (group["lr"], group["weight_decay"])
        if key not in merged:
            merged[key] = {**group, "params": []}
        else:
            merged[key]["name"] += "+" + group["name"]
        merged[key]["params"] += group["params"]
    return list(merged.values())


def refuse_other_groups(optimizer, folder) -> None:
    """Have `optimizer` refuse, in one line, a saved state of other parameter groups: a run's
    checkpoint (`folder`) written by a kit that grouped them otherwise (before merged_groups:
    one group per depth) cannot resume here. torch's own ValueError would read as a corrupt
    checkpoint (kit.train.run_state); this says what happened and what to do."""
    def check(opt, state: dict) -> None:
        saved = [len(g["params"]) for g in state["param_groups"]]
        here = [len(g["params"]) for g in opt.param_groups]
        if saved != here:
            raise CheckpointError(
                f"{folder} was written by another version of the kit: its optimizer state has "
                f"{len(saved)} parameter group(s), this kit's optimizer {len(here)} (kit.train."
                "optim merges the groups of equal settings, which older kits kept one per "
                "layer): finish the run with the kit version that started it, or delete that "
                "folder to restart the run from scratch")
    optimizer.register_load_state_dict_pre_hook(check)


def _depth_name(depth: int, top: int) -> str:
    return "embeddings" if depth == 0 else "top" if depth == top else f"layer{depth - 1}"


class LinearSchedule:
    """Linear warm-up then linear decay to 0, as a function of training progress in [0, 1].
    Progress (not a step count) because SSA and BERT-mask epochs vary in size."""

    def __init__(self, optimizer, warmup_ratio: float):
        self.optimizer, self.warmup = optimizer, warmup_ratio
        self.base = [g["lr"] for g in optimizer.param_groups]
        self.lr = self.base[0]

    def set_progress(self, p: float) -> float:
        """Set the lr of progress `p`; returns (and keeps as `lr`) the first group's."""
        factor = p / self.warmup if p < self.warmup else (1 - p) / (1 - self.warmup)
        for group, lr in zip(self.optimizer.param_groups, self.base):
            group["lr"] = lr * max(factor, 0.0)
        self.lr = self.optimizer.param_groups[0]["lr"]
        return self.lr
