"""torchtune's loss paths (speed/terms.loss_bytes) against a byte count made by hand from its code.

The hand count lists every memory-bound kernel of the loss path with the bytes it reads and writes per logit
(pytorch/torchtune@1814feb1: TransformerDecoder.forward returns ``self.output(h).float()`` unless the model runs
its head in chunks; CEWithChunkedOutputLoss.compute_cross_entropy is ``F.cross_entropy(logits.float(), ...)``;
with compile the recipe compiles each decoder layer and the loss, never the head). The sums below are written
from those kernels, not read from efficiency.json, so a changed data row fails here. No wall-clock time is asserted.
"""

from __future__ import annotations

import pytest

from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup
from perfguide.speed import terms, traffic

#: (read, write) bytes per logit of each kernel, 16-bit logits, fp32 loss
PLAIN_COMPILED = [
    (2, 4),   # eager .float() in the model's forward
    (4, 0),   # compiled cross-entropy forward: max over the vocabulary
    (4, 0),   # ... then the sum of exp (a looped reduction reads the row again)
    (4, 4),   # compiled cross-entropy backward: softmax - one-hot, fp32 gradient
    (4, 2),   # the eager cast's backward: fp32 gradient -> 16 bit
]
CHUNKED_COMPILED = [
    (2, 0),   # compiled upcast + max (the cast fuses into the reduction)
    (2, 0),   # compiled upcast + sum of exp
    (2, 2),   # compiled backward: reads the 16-bit logits, writes their 16-bit gradient
]
CHUNKS = 8    # CEWithChunkedOutputLoss(num_output_chunks=8)


def _bytes(kernels: list[tuple[int, int]]) -> int:
    return sum(r + w for r, w in kernels)


def llama32_3b() -> ModelSpec:
    """meta-llama/Llama-3.2-3B config.json: hidden 3072, 28 layers, 24 heads (8 KV), MLP 8192, vocab 128256, tied head."""
    return ModelSpec.from_any({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 3072, "num_hidden_layers": 28,
        "num_attention_heads": 24, "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256,
        "tie_word_embeddings": True, "max_position_embeddings": 131072, "torch_dtype": "bfloat16"})


def _setup(**kw: object) -> Setup:
    base: dict[str, object] = {"micro_batch_size": 2, "seq_len": 4096, "weights_dtype": "bf16", "torch_compile": True}
    base.update(kw)
    return Setup.model_validate(base)


def test_compiled_paths_are_the_hand_counted_bytes_per_logit() -> None:
    """2 x 4096 tokens x 128256 logits: the plain path 28 B per logit, the chunked one 8 B per logit plus 7 sums of
    the tied head's 128256 x 3072 bf16 gradient at 6 B per element."""
    spec, setup = llama32_3b(), _setup()
    logits = 2 * 4096 * 128256
    assert _bytes(PLAIN_COMPILED) == 28 and _bytes(CHUNKED_COMPILED) == 8
    assert terms.loss_bytes(spec, setup, "upcast_in_model") == pytest.approx(logits * 28)
    head_sums = (CHUNKS - 1) * 128256 * 3072 * (2 + 2 + 2)
    assert terms.loss_bytes(spec, setup, "chunked_upcast_in_loss") == pytest.approx(logits * 8 + head_sums)


def test_chunking_saves_bytes_only_above_its_break_even_tokens() -> None:
    """Chunking saves (28 - 8) B per logit and pays 7 x 6 B per head-weight element: with V logits per token and a
    V x h head it saves bytes only above 7 x 6 x h / 20 tokens per micro-step (6451 at h = 3072): the README's
    2 x 4096 tokens on Llama 3.2 3B sit above it (~4.5 GB saved of ~29 GB), 1 x 4096 below it."""
    spec = llama32_3b()
    break_even = (CHUNKS - 1) * 6 * 3072 / (_bytes(PLAIN_COMPILED) - _bytes(CHUNKED_COMPILED))
    assert break_even == pytest.approx(6451.2)
    for batch, saves in ((2, True), (1, False)):
        setup = _setup(micro_batch_size=batch)
        saved = terms.loss_bytes(spec, setup, "upcast_in_model") - terms.loss_bytes(spec, setup, "chunked_upcast_in_loss")
        assert (saved > 0) is saves
        assert saved == pytest.approx(batch * 4096 * 128256 * 20 - (CHUNKS - 1) * 128256 * 3072 * 6)


def test_lora_freezes_the_head_so_chunking_sums_no_gradient() -> None:
    spec = llama32_3b()
    setup = _setup(lora=LoraSpec(r=64, alpha=128))
    assert terms.loss_bytes(spec, setup, "chunked_upcast_in_loss") == pytest.approx(2 * 4096 * 128256 * 8)


def test_eager_paths_run_transformers_ops() -> None:
    """Without compile both torchtune losses run a cast then F.cross_entropy, transformers' traced ops; chunking still
    sums the head gradient; transformers' own loss (None) keeps the block kernel factor (1 in eager)."""
    spec, eager = llama32_3b(), _setup(torch_compile=False)
    traced = traffic.head_bytes(spec, eager)
    assert terms.loss_bytes(spec, eager, "upcast_in_model") == pytest.approx(traced)
    assert terms.loss_bytes(spec, eager, None) == pytest.approx(traced)
    assert terms.loss_bytes(spec, eager, "chunked_upcast_in_loss") == pytest.approx(traced + (CHUNKS - 1) * 128256 * 3072 * 6)


def test_elementwise_bytes_carry_the_loss_path() -> None:
    """The loss path enters the priced bytes once, beside the blocks (which it does not scale)."""
    spec, setup = llama32_3b(), _setup()
    hf = terms.elementwise_bytes(spec, setup, "torchtune")
    tt = terms.elementwise_bytes(spec, setup, "torchtune", "upcast_in_model")
    delta = terms.loss_bytes(spec, setup, "upcast_in_model") - terms.loss_bytes(spec, setup, None)
    assert tt - hf == pytest.approx(traffic.priced(delta))
