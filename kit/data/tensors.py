"""A batch of tokenized rows (kit.data.pipeline's Examples) as the torch tensors a model takes."""
from __future__ import annotations

import numpy as np
import torch

from kit.data.pipeline import IGNORE, Examples, pad_rows, real_positions


def collate(examples: Examples, idx: list[int], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad the rows `idx` to their longest one: input ids with `pad_id`, the attention mask and
    token types with 0, the special-token mask with True (padding is never labelled), SSA
    labels with IGNORE."""
    real = real_positions([examples.input_ids[i] for i in idx])

    def padded(rows: list[np.ndarray], fill, dtype) -> torch.Tensor:
        return torch.from_numpy(pad_rows([rows[i] for i in idx], fill, dtype, real))

    batch = {"input_ids": padded(examples.input_ids, pad_id, np.int64),
             "attention_mask": torch.from_numpy(real.astype(np.int64)),
             "special_mask": padded(examples.special, True, bool),
             "labels": torch.from_numpy(examples.labels[np.asarray(idx)]),
             "rows": torch.as_tensor(idx, dtype=torch.int64)}
    if examples.token_type_ids is not None:
        batch["token_type_ids"] = padded(examples.token_type_ids, 0, np.int64)
    if examples.ssa_labels is not None:
        batch["ssa_labels"] = padded(examples.ssa_labels, IGNORE, np.int64)
    return batch
