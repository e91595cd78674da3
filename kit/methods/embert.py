"""EmBERT and Gated-BERT on top of any BERT-style Hugging Face encoder.

EmBERT (task-embedded attention): in every layer the current task's vectors are added to the
attention projections, Q = W_q h + e_q[t], K = W_k h + e_k[t], V = W_v h + e_v[t].
Gated-BERT: EmBERT plus, in the last layer only, per-task adapters on Q, K (low rank:
hidden -> r -> hidden) and V (hidden -> hidden), where the other tasks' Q/K adapters are mixed in
through a softmax gate over tasks computed from the sequence:

    Q = W_q h + e_q[t] + A^q_t(h) + sum_{j != t} g^q_j(h) A^q_j(h)     (K likewise, own gate)
    V = W_v h + e_v[t] + A^v_t(h)

How it attaches: the pretrained encoder is left as it is (its weights, its state-dict names,
save_pretrained all unchanged); forward hooks on the query/key/value Linear modules of each
self-attention add the terms above. The task id reaches the hooks through the model: `forward`
(or `set_task`) records the batch's task index and attention mask before the encoder runs, so
every batch is single-task. New parameters start at zero (task embeddings, adapter up-projections,
gates), so a freshly built model computes exactly what the pretrained encoder computes.

Differences from the released code (RunzeSu/Gated_bert), all deliberate:
- the gate reads the mean of the layer's input over real (non-padding) tokens; the released gate
  flattens exactly 128 positions (fixed padding, batch size 32 hard-coded);
- another task's adapters get no gradient from this task's batches (their weights are detached),
  the evident intent of the released per-step requires_grad toggling (whose condition in fact
  froze every adapter); the per-task scale vectors of the released layer are left out (the
  zero-initialised up-projections already learn the scale);
- the staged freezing is by epoch (config: gate_start_epoch, freeze_qkv_epoch).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from kit import methods
from kit.models.attention_mask import encoder_mask
from kit.models.backbones import ModelError
from kit.models.model_io import load_folder

RELEASED_HIDDEN, RELEASED_RANK = 768, 204     # BERT-base: 768 -> 204 -> 768


@dataclass
class MultiTaskSpec:
    tasks: list[str]                   # canonical task names, in head order
    num_labels: list[int]
    regression: list[bool]
    method: str = "embert"             # embert | gated
    adapter_rank: int = 0              # gated: resolved rank (0 = scaled from the hidden size)


def default_rank(hidden: int) -> int:
    """The released 768 -> 204 bottleneck, scaled to the encoder's width (minilm 384 -> 102)."""
    return max(1, round(hidden * RELEASED_RANK / RELEASED_HIDDEN))


def self_attentions(backbone) -> list[nn.Module]:
    """The self-attention modules (with query/key/value Linear layers), bottom to top."""
    layers = getattr(getattr(backbone, "encoder", None), "layer", None)
    found = [getattr(getattr(layer, "attention", None), "self", None) for layer in layers or []]
    if not found or not all(isinstance(getattr(a, n, None), nn.Linear)
                            for a in found for n in ("query", "key", "value")):
        raise ModelError(f"{type(backbone).__name__}: embert/gated need a BERT-style encoder "
                         "(encoder.layer[i].attention.self.query/key/value)")
    return found


def masked_mean(hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean over the real tokens of each row: (B, S, H), mask (B, S) -> (B, H). Any length."""
    if mask is None:
        return hidden.mean(dim=1)
    weights = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


class TaskGate(nn.Module):
    """A softmax over tasks from the sequence: softmax(W mean_real_tokens(h) + b), shape (B, T).
    Zero-initialised: uniform 1/T at the start."""

    def __init__(self, hidden: int, n_tasks: int):
        super().__init__()
        self.proj = nn.Linear(hidden, n_tasks)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return torch.softmax(self.proj(masked_mean(hidden, mask)).float(), dim=-1)


class TaskAdapters(nn.Module):
    """One adapter per task, stored stacked: low rank (h -> r -> out) or full (h -> out) when
    rank is None. Up-projections start at zero, so adapters start as the zero function."""

    def __init__(self, n_tasks: int, hidden: int, out: int, rank: int | None, std: float):
        super().__init__()
        self.low_rank = rank is not None
        if self.low_rank:
            self.down = nn.Parameter(torch.randn(n_tasks, rank, hidden) * std)
            self.down_bias = nn.Parameter(torch.zeros(n_tasks, rank))
            self.up = nn.Parameter(torch.zeros(n_tasks, out, rank))
        else:
            self.up = nn.Parameter(torch.zeros(n_tasks, out, hidden))
        self.up_bias = nn.Parameter(torch.zeros(n_tasks, out))

    def one(self, h: torch.Tensor, t: int) -> torch.Tensor:
        """Task t's adapter on h (B, S, H), with gradients."""
        if self.low_rank:
            h = F.linear(h, self.down[t], self.down_bias[t])
        return F.linear(h, self.up[t], self.up_bias[t])

    def all_detached(self, h: torch.Tensor) -> torch.Tensor:
        """Every task's adapter on h, weights detached: (T, B, S, out)."""
        if self.low_rank:
            h = torch.einsum("bsh,trh->tbsr", h, self.down.detach()) + \
                self.down_bias.detach()[:, None, None, :].to(h.dtype)
            return torch.einsum("tbsr,tor->tbso", h, self.up.detach()) + \
                self.up_bias.detach()[:, None, None, :].to(h.dtype)
        return torch.einsum("bsh,toh->tbso", h, self.up.detach()) + \
            self.up_bias.detach()[:, None, None, :].to(h.dtype)


class GatedLayer(nn.Module):
    """The new parameters of Gated-BERT's last layer: Q/K/V adapters and the Q/K gates."""

    def __init__(self, n_tasks: int, hidden: int, out: int, rank: int, std: float):
        super().__init__()
        self.adapters = nn.ModuleDict({
            "query": TaskAdapters(n_tasks, hidden, out, rank, std),
            "key": TaskAdapters(n_tasks, hidden, out, rank, std),
            "value": TaskAdapters(n_tasks, hidden, out, None, std)})
        self.gates = nn.ModuleDict({"query": TaskGate(hidden, n_tasks),
                                    "key": TaskGate(hidden, n_tasks)})

    def delta(self, slot: str, h: torch.Tensor, mask: torch.Tensor | None, t: int) -> torch.Tensor:
        """What the adapters add to projection `slot` for a batch of task t."""
        adapters = self.adapters[slot]
        own = adapters.one(h, t)
        if slot not in self.gates or adapters.up.shape[0] == 1:
            return own
        gate = self.gates[slot](h, mask).to(h.dtype)                 # (B, T)
        others = torch.ones_like(gate)
        others[:, t] = 0                                              # own adapter: weight 1
        weights = (gate * others).transpose(0, 1)[:, :, None, None]    # (T, B, 1, 1)
        return own + (weights * adapters.all_detached(h)).sum(dim=0)


class MultiTaskModel(nn.Module):
    """A BERT-style encoder with EmBERT task embeddings (and, for `gated`, the gated last layer) and
    one head per task on the pooled [CLS]. Call with `task=` or after `set_task(t)`; the signature
    otherwise matches SequenceModel, so kit.train.finetune's prediction helpers work on it."""

    def __init__(self, backbone, spec: MultiTaskSpec):
        super().__init__()
        if not methods.get(spec.method).multitask:
            raise ValueError(f"MultiTaskModel: method {spec.method!r} is not a multi-task method "
                             f"({', '.join(methods.names(multitask=True))})")
        self.backbone, self.spec = backbone, spec
        cfg = backbone.config
        attentions = self_attentions(backbone)
        out = attentions[0].query.out_features
        n_tasks, n_layers = len(spec.tasks), len(attentions)
        dropout = getattr(cfg, "classifier_dropout", None)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob if dropout is None else dropout)
        self.heads = nn.ModuleList(nn.Linear(cfg.hidden_size, n) for n in spec.num_labels)
        for head in self.heads:
            head.weight.data.normal_(0.0, cfg.initializer_range)
            head.bias.data.zero_()
        # e[layer, q/k/v, task]: zero, so the model starts as the pretrained encoder
        self.task_embeddings = nn.Parameter(torch.zeros(n_layers, 3, n_tasks, out))
        self.gated = None
        if methods.get(spec.method).gated:
            spec.adapter_rank = spec.adapter_rank or default_rank(cfg.hidden_size)
            self.gated = GatedLayer(n_tasks, cfg.hidden_size, out, spec.adapter_rank,
                                    cfg.initializer_range)
        self._task, self._mask = 0, None
        self._handles = []
        for layer, attention in enumerate(attentions):
            for slot, name in enumerate(("query", "key", "value")):
                gated = self.gated is not None and layer == n_layers - 1
                hook = functools.partial(self._projection_hook, layer, slot, name, gated)
                self._handles.append(getattr(attention, name).register_forward_hook(hook))

    # --------------------------------------------------------------- task routing
    def set_task(self, task: int) -> None:
        if not 0 <= task < len(self.heads):
            raise IndexError(f"task index {task} outside 0..{len(self.heads) - 1}")
        self._task = int(task)

    @property
    def task(self) -> int:
        return self._task

    def _projection_hook(self, layer: int, slot: int, name: str, gated: bool, module, args,
                         output):
        t = self._task
        output = output + self.task_embeddings[layer, slot, t].to(output.dtype)
        if gated:
            output = output + self.gated.delta(name, args[0], self._mask, t).to(output.dtype)
        return output

    # --------------------------------------------------------------- forward
    def forward(self, input_ids, attention_mask, special_mask=None, token_type_ids=None,
                task: int | None = None, output_attentions: bool = False) -> dict:
        if task is not None:
            self.set_task(task)
        self._mask = attention_mask
        kwargs = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
        try:
            out = self.backbone(input_ids=input_ids,
                                attention_mask=encoder_mask(self.backbone, attention_mask),
                                output_attentions=output_attentions, **kwargs)
        finally:
            self._mask = None
        tokens = out.last_hidden_state
        pooled = getattr(out, "pooler_output", None)
        pooled = tokens[:, 0] if pooled is None else pooled
        logits = self.heads[self._task](self.dropout(pooled))
        return {"logits": logits, "token_logits": None, "token_weights": None,
                "attentions": out.attentions if output_attentions else None}


# ------------------------------------------------------------------- staged freezing (gated)

def gate_parameters(model: MultiTaskModel) -> list[nn.Parameter]:
    return [] if model.gated is None else list(model.gated.gates.parameters())


def adapter_parameters(model: MultiTaskModel) -> list[nn.Parameter]:
    return [] if model.gated is None else list(model.gated.adapters.parameters())


def base_qkv_parameters(model: MultiTaskModel) -> list[nn.Parameter]:
    """The pretrained Q/K/V weights and biases of the gated (last) layer."""
    attention = self_attentions(model.backbone)[-1]
    return [p for name in ("query", "key", "value") for p in getattr(attention, name).parameters()]


def apply_stage(model: MultiTaskModel, epoch: int, gate_start_epoch: int,
                freeze_qkv_epoch: int, trainable: set[int] | None = None) -> str:
    """Gated-BERT's staged freezing, by epoch: before `gate_start_epoch` the adapters train with
    the gate fixed; then the gate trains too; from `freeze_qkv_epoch` the last layer's base
    Q/K/V are frozen and only the adapters (and everything outside that layer) adapt them.
    `trainable` (ids of the parameters trainable before any stage, e.g. after freeze_layers)
    keeps a parameter frozen by the caller frozen. EmBERT: nothing to do. Returns the stage."""
    if model.gated is None:
        return "all"
    allowed = (lambda p: True) if trainable is None else (lambda p: id(p) in trainable)
    for p in adapter_parameters(model):
        p.requires_grad_(allowed(p))
    for p in gate_parameters(model):
        p.requires_grad_(epoch >= gate_start_epoch and allowed(p))
    for p in base_qkv_parameters(model):
        p.requires_grad_(epoch < freeze_qkv_epoch and allowed(p))
    if epoch < gate_start_epoch:
        return "adapters"
    return "adapters+gate" if epoch < freeze_qkv_epoch else "adapters+gate, qkv frozen"


# ------------------------------------------------------------------- save / load

def load_multitask(folder: str | Path, eager_attention: bool = False):
    """(model, tokenizer) from a checkpoint folder written by kit.models.model_io.save_model (a
    kit-only folder: plain transformers refuses it with a line naming kit.models.model_io)."""
    return load_folder(folder, MultiTaskSpec, MultiTaskModel, eager_attention)
