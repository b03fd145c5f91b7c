"""GPT-2 through transformers 5.1 registers a causal-mask buffer in every block (eras.attention_buffer_bytes,
data/activations.json attention_eras ``mask_buffer_bytes_per_position2``).

Hand-derived from modeling_gpt2.py as released: ``GPT2Attention.__init__`` registers ``bias = torch.tril(torch.ones(
(max_positions, max_positions), dtype=torch.uint8))`` (4.18.0 wheel line 140; bool from 4.42.4 on; 5.0.0 and 5.1.0
line 97) with max_positions = config.max_position_embeddings; 5.2.0 and later register none. One byte per
max_positions^2 per block: gpt2-large (n_positions 1024, 36 blocks) 1024^2 x 36 = 37,748,736 B; gpt2-xl (48 blocks)
50,331,648 B.
"""

from __future__ import annotations

from perfguide.memory.eras import attention_buffer_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import Setup


def _setup(attn: str) -> Setup:
    return Setup(task="train", micro_batch_size=8, seq_len=128, weights_dtype="fp32", attn_implementation=attn)


def test_gpt2_blocks_keep_the_mask_until_5_2() -> None:
    large, xl = ModelSpec.from_any("openai-community/gpt2-large"), ModelSpec.from_any("openai-community/gpt2-xl")
    for attn in ("eager", "sdpa"):
        assert attention_buffer_bytes(large, _setup(attn), "4.18.0") == 1024 * 1024 * 36 == 37_748_736
        assert attention_buffer_bytes(xl, _setup(attn), "5.1.0") == 1024 * 1024 * 48
        assert attention_buffer_bytes(large, _setup(attn), "5.2.0") == 0
        assert attention_buffer_bytes(large, _setup(attn), "5.24.0") == 0


def test_only_gpt2_itself() -> None:
    # families alias gptj / gpt_neo / phi to gpt2's activation coefficients, not to its modeling file's buffers
    spec = ModelSpec.from_any("microsoft/phi-2")
    assert spec.model_type != "gpt2"
    assert attention_buffer_bytes(spec, _setup("eager"), "4.18.0") == 0
