"""The residual stream a checkpointed block keeps: fp32 under a quantized base whose other parameters peft upcast.

Issue 24 (long context): Unsloth's HF + FA2 column (Llama-3.1-8B QLoRA, batch 1, checkpointing) implies more bytes per
token than perfguide charged; one missing term is the checkpointed block inputs, which are fp32 (4 B per hidden
element) once prepare_model_for_kbit_training has cast the embeddings and norms to fp32, not 16-bit.
"""

from __future__ import annotations

import pytest
from helpers import tiny_config, tiny_model

from perfguide.memory import activations as act
from perfguide.memory.analytic import training_memory
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup

B, S = 2, 512
LORA = LoraSpec(r=8, alpha=16, target_modules=("q_proj", "v_proj"))


def tiny_spec() -> ModelSpec:
    return ModelSpec.from_any(tiny_config())


def _setup(weights: str, upcast: bool = True) -> Setup:
    return Setup(task="train", micro_batch_size=B, seq_len=S, weights_dtype=weights, lora=LORA, optimizer="adamw_torch",
                 gradient_checkpointing=True, kbit_upcast=upcast)  # type: ignore[arg-type]


@pytest.mark.parametrize(("weights", "upcast", "nbytes"), [("nf4", True, 4), ("int8", True, 4), ("nf4", False, 2), ("bf16", True, 2)])
def test_checkpoint_boundary_is_hidden_times_stream_dtype(weights: str, upcast: bool, nbytes: int) -> None:
    """Hand-derived: one block keeps b * s * hidden elements of the stream; 4 bytes each when the base is
    quantized and upcast (kbit_upcast), 2 when its other parameters stay 16-bit (litgpt, fsdp_qlora) or it is bf16."""
    spec = tiny_spec()
    assert act.checkpoint_boundary_bytes(spec, _setup(weights, upcast)) == B * S * spec.hidden_size * nbytes


def test_upcast_adds_two_bytes_per_hidden_per_block_to_the_checkpointed_activations() -> None:
    spec = tiny_spec()
    up = training_memory(spec, _setup("nf4", True))
    plain = training_memory(spec, _setup("nf4", False))
    fp32_mlp = B * S * spec.intermediate_size * 3 * 2   # and the recomputed block's gated MLP runs fp32 (test_block_backward.py)
    assert up.activations - plain.activations == spec.num_layers * B * S * spec.hidden_size * 2 + fp32_mlp


def test_real_modules_keep_an_fp32_stream_after_kbit_upcast() -> None:
    """Real tensors: peft's prepare_model_for_kbit_training casts every 16-bit parameter of the tiny Llama to fp32;
    under bf16 autocast (Trainer bf16=True) every block after the first receives an fp32 hidden state, which is what
    checkpointing saves; the element size is the coefficient stream_regime() picks."""
    import torch
    from peft import prepare_model_for_kbit_training

    model = tiny_model().to(torch.bfloat16)
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    ids = torch.randint(0, model.config.vocab_size, (1, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids=ids, output_hidden_states=True)
    coef = act.family_coefficients("llama", "llama")[act.stream_regime(_setup("nf4"))].ckpt_per_token["h"]
    assert {h.element_size() for h in out.hidden_states[1:]} == {int(coef)} == {4}
