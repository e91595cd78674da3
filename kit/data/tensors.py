"""A batch of tokenized rows (kit.data.pipeline's Examples) as the torch tensors a model takes."""
from __future__ import annotations

import numpy as np
import torch

from kit.data.pipeline import IGNORE, Examples, StaticShape, pad_rows, real_positions


def collate(examples: Examples, idx: list[int], pad_id: int,
            shape: StaticShape | None = None) -> dict[str, torch.Tensor]:
    """Pad the rows `idx` to their longest one: input ids with `pad_id`, the attention mask and
    token types with 0, the special-token mask with True (padding is never labelled), SSA
    labels with IGNORE. `shape`: to its length bucket instead, and to its number of rows with
    copies of the first row (real tokens, so attention stays finite there) that `weight` (0 on
    them, 1 on the rows) and IGNORE SSA labels keep out of every loss; `rows` lists the rows."""
    picked = list(idx)
    if shape is not None:
        picked += [picked[0]] * (shape.rows - len(picked))
    rows = [examples.input_ids[i] for i in picked]
    longest = max(map(len, rows), default=0)
    real = real_positions(rows, longest if shape is None else shape.length(longest))

    def padded(arrays: list[np.ndarray], fill, dtype) -> torch.Tensor:
        return torch.from_numpy(pad_rows([arrays[i] for i in picked], fill, dtype, real))

    batch = {"input_ids": padded(examples.input_ids, pad_id, np.int64),
             "attention_mask": torch.from_numpy(real.astype(np.int64)),
             "special_mask": padded(examples.special, True, bool),
             "labels": torch.from_numpy(examples.labels[np.asarray(picked)]),
             "rows": torch.as_tensor(idx, dtype=torch.int64)}
    if examples.token_type_ids is not None:
        batch["token_type_ids"] = padded(examples.token_type_ids, 0, np.int64)
    if examples.ssa_labels is not None:
        batch["ssa_labels"] = padded(examples.ssa_labels, IGNORE, np.int64)
        batch["ssa_labels"][len(idx):] = IGNORE
    if shape is not None:
        batch["weight"] = torch.from_numpy((np.arange(len(picked)) < len(idx)).astype(np.float32))
    return batch
