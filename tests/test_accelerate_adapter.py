"""kit.train.accelerate_adapter: one test per private part of accelerate the kit relies on, each
failing on an accelerate that changed it (pyproject.toml bounds accelerate to the versions these
passed on)."""
import random

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import set_seed
from accelerate.utils.constants import SCALER_NAME

from kit.train import accelerate_adapter as adapter


def accelerator_in(precision: str) -> Accelerator:
    adapter.reset_precision(precision)
    return Accelerator(mixed_precision=precision, cpu=True)


def test_a_second_precision_in_one_process_needs_the_reset():
    assert isinstance(AcceleratorState._shared_state, dict)
    accelerator_in("bf16")
    assert AcceleratorState._shared_state["_mixed_precision"] == "bf16"
    with pytest.raises(ValueError):             # what the reset is for
        Accelerator(mixed_precision="no", cpu=True)
    adapter.reset_precision("no")
    assert Accelerator(mixed_precision="no", cpu=True).mixed_precision == "no"


def test_fp16_on_a_cpu_gets_accelerates_own_loss_scaling():
    accelerator = accelerator_in("fp16")
    assert accelerator.native_amp is False and accelerator.scaler is None   # fp32 labelled fp16
    adapter.fp16_on_cpu(accelerator)
    linear = torch.nn.Linear(1, 1)
    model, optimizer = accelerator.prepare(linear, torch.optim.SGD(linear.parameters(), lr=1.0))
    before = model.weight.detach().clone()
    # the first scale, 2 ** 16, overflows fp16's gradient of the output: the prepared optimizer
    # skips the step and the scaler halves the scale - fp16's loss scaling, on a CPU
    accelerator.backward(model(torch.ones(1, 1)).sum())
    optimizer.step()
    assert accelerator.scaler.get_scale() == 2.0 ** 15 and torch.equal(model.weight, before)


def test_the_scaler_is_set_aside_and_back(tmp_path):
    assert adapter.SCALER_FILE == SCALER_NAME
    accelerator = accelerator_in("fp16")
    adapter.fp16_on_cpu(accelerator)
    scaler = accelerator.scaler
    with adapter.scaler_set_aside(accelerator, tmp_path):       # no scaler.pt there
        assert accelerator.scaler is None
    assert accelerator.scaler is scaler
    (tmp_path / SCALER_NAME).touch()
    with adapter.scaler_set_aside(accelerator, tmp_path):
        assert accelerator.scaler is scaler


def test_save_state_names_its_model_files_and_rng_states(tmp_path):
    accelerator = accelerator_in("no")
    first, second = accelerator.prepare(torch.nn.Linear(2, 2), torch.nn.Linear(3, 1))
    set_seed(7)
    expected = {"python": random.getstate(), "numpy": np.random.get_state(),
                "torch": torch.get_rng_state()}
    accelerator.save_state(str(tmp_path))
    assert adapter.model_file(tmp_path, 0).is_file() and adapter.model_file(tmp_path, 1).is_file()
    assert adapter.rng_files(tmp_path) == [tmp_path / "random_states_0.pkl"]
    states = adapter.rng_states(tmp_path, 0)
    assert {"python", "numpy", "torch", "step"} <= states.keys()
    assert states["python"] == expected["python"] and states["step"] == accelerator.step
    assert np.array_equal(states["numpy"][1], expected["numpy"][1])
    assert torch.equal(states["torch"], expected["torch"])


@pytest.mark.parametrize("asked", ["sdpa", "eager"])
def test_transformers_attention_implementation_is_read_where_it_is_set(asked):
    """kit.models.transformers_adapter: the one private attribute of transformers the kit reads
    (the masks it builds and the packed SDPA it registers follow it)."""
    from transformers import BertConfig, BertModel

    from kit.models.transformers_adapter import attn_implementation
    model = BertModel(BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=16,
                                 attn_implementation=asked))
    assert attn_implementation(model.config) == asked
    model.set_attn_implementation("eager" if asked == "sdpa" else "sdpa")
    assert attn_implementation(model.config) == ("eager" if asked == "sdpa" else "sdpa")
