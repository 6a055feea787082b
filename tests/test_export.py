"""``torch.export`` of models on pjrt (issue 23, item 1).

A CNN, and a Llama and a BERT built from small Hugging Face configs, with parameters and
inputs on pjrt, are exported with a dynamic batch dimension (``torch.export.Dim``); the
exported program's module, run on pjrt at the export's batch size and at another one,
gives the CPU model's outputs.
"""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim, export

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.norm(self.conv(x))), 2)
        return self.fc(x.flatten(1))


def _llama():
    import transformers as hf

    config = hf.LlamaConfig(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        use_cache=False,
    )
    return hf.LlamaForCausalLM(config)


def _bert():
    import transformers as hf

    config = hf.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return hf.BertModel(config)


def _main_output(out):
    for name in ("logits", "last_hidden_state"):
        if hasattr(out, name):
            return getattr(out, name)
    return out


CASES = {
    "cnn": (CNN, lambda batch: torch.randn(batch, 3, 8, 8), "x"),
    "llama": (_llama, lambda batch: torch.randint(0, 100, (batch, 8)), "input_ids"),
    "bert": (_bert, lambda batch: torch.randint(0, 100, (batch, 8)), "input_ids"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_export_on_pjrt_with_a_dynamic_batch(name):
    make, inputs, arg = CASES[name]
    torch.manual_seed(0)
    model = make().eval()
    on_pjrt = make().eval()
    on_pjrt.load_state_dict(model.state_dict())
    on_pjrt.to("pjrt")
    x = inputs(2)
    exported = export(on_pjrt, (x.to("pjrt"),), dynamic_shapes={arg: {0: Dim("batch", max=16)}})
    held = {t.device.type for t in exported.state_dict.values()}
    assert held == {"pjrt"}, held  # (no move to the CPU)
    for batch in (2, 5):
        x = inputs(batch)
        with torch.no_grad():
            expected = _main_output(model(x))
            got = _main_output(exported.module()(x.to("pjrt")))
        assert got.device.type == "pjrt"
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)
