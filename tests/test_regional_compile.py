"""kit.models.regional_compile: it finds the encoder's layers (not the embeddings, not a head),
compiles each in place and leaves the model's parameters and state-dict names as they were, so
checkpoints and saved models are unchanged. The compiled layers are traced for real (dynamo and
AOTAutograd, forward and backward) with the aot_eager backend: inductor's code generation would
add ~15-25 s of a cold compile to the suite, and it ran on an AMX CPU and an H100 in the
benchmarks (what it costs and gains: docs/benchmarks.md)."""
import torch
from torch import nn
from transformers import BertConfig, BertModel

from kit.models.regional_compile import compile_layers, repeated_layers


def _tiny_bert() -> BertModel:
    return BertModel(BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=3,
                                num_attention_heads=2, intermediate_size=16))


def test_the_repeated_block_is_the_encoders_layer_list():
    model = nn.Sequential(_tiny_bert(), nn.ModuleList([nn.Linear(8, 8), nn.ReLU()]))
    assert repeated_layers(model) is model[0].encoder.layer
    assert repeated_layers(nn.Linear(2, 2)) is None


def test_layers_compile_in_place_and_the_state_dict_keeps_its_names():
    model = _tiny_bert()
    names, params = list(model.state_dict()), [id(p) for p in model.parameters()]
    assert compile_layers(model) == 3
    assert all(layer._compiled_call_impl is not None for layer in model.encoder.layer)
    assert list(model.state_dict()) == names
    assert [id(p) for p in model.parameters()] == params
    assert compile_layers(nn.Linear(2, 2)) == 0


def test_compiled_layers_compute_the_eager_outputs_and_gradients():
    torch.manual_seed(0)
    model = _tiny_bert().eval()
    ids = torch.randint(0, 50, (2, 5))
    eager = model(input_ids=ids).last_hidden_state
    eager.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    assert compile_layers(model, dynamic=False, backend="aot_eager") == 3
    torch._dynamo.reset()
    compiled = model(input_ids=ids).last_hidden_state
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1     # traced, not skipped
    compiled.sum().backward()
    assert torch.allclose(compiled, eager, atol=1e-6)
    got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert got.keys() == grads.keys() and len(got) > 30           # every layer's weights
    assert all(torch.allclose(got[n], g, atol=1e-6) for n, g in grads.items())
