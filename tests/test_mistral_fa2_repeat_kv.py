"""Mistral's FlashAttention2 before transformers 4.48 saves query-wide keys and values (eras.attention_era_bytes,
data/activations.json attention_eras ``repeats_kv``).

transformers 4.34-4.47 ``MistralFlashAttention2.forward`` calls ``repeat_kv`` on the keys and values before casting
q, k and v to the kernel's 16-bit dtype; flash_attn saves what it was given, so a checkpointed Mistral-7B block
(32 query heads, 8 key/value heads of 128) saves per token 2 x (4096 - 1024) elements more than the installed
release's kernel call, which passes the grouped heads: at 2 B, 12,288 B per token in the one recomputed block, or
32 blocks' worth without checkpointing. The April-2024 QLoRA stack (transformers 4.39.3 + peft 0.10.0) is traced
against the installed one by scripts/trace_block_backward.py when a venv with those releases exists
(PERFGUIDE_STACK439_PYTHON, default /tmp/venv439/bin/python; see the script's ``--compare``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from perfguide.memory.eras import attention_era_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup

ROOT = Path(__file__).resolve().parents[1]
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _mistral(model_type: str = "mistral") -> ModelSpec:
    from transformers import LlamaConfig, MistralConfig

    cls = MistralConfig if model_type == "mistral" else LlamaConfig
    return ModelSpec.from_any(cls(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                                  num_hidden_layers=32, vocab_size=32000))


def _qlora(attn: str = "flash_attention_2", seq_len: int = 1000) -> Setup:
    return Setup(task="train", micro_batch_size=1, seq_len=seq_len, weights_dtype="nf4", autocast="bf16", kbit_upcast=True,
                 lora=LoraSpec(r=32, alpha=16, target_modules=ALL), gradient_checkpointing=True,
                 optimizer="adamw_torch", attn_implementation=attn)


@pytest.mark.parametrize("release", ["4.39.3", "4.47.1"])
def test_repeated_keys_and_values_by_hand(release: str) -> None:
    """(2 x 32 x 128 - 2 x 8 x 128) elements x 2 B x 1000 tokens in the recomputed block; x 32 blocks unchecked."""
    spec, setup = _mistral(), _qlora()
    assert attention_era_bytes(spec, setup, release, checkpointed=True) == (2 * 4096 - 2 * 1024) * 2 * 1000 == 12_288_000
    assert attention_era_bytes(spec, setup, release) == 12_288_000 * 32


def test_no_repeat_from_4_48_in_llama_or_outside_fa2() -> None:
    """4.48.0's flash_attention_forward takes the grouped heads; Llama's FlashAttention2 never repeated them; the
    entry is FA2's (sdpa is priced as the installed release runs it)."""
    assert attention_era_bytes(_mistral(), _qlora(), "4.48.0", checkpointed=True) == 0
    assert attention_era_bytes(_mistral("llama"), _qlora(), "4.39.3", checkpointed=True) == 0
    assert attention_era_bytes(_mistral(), _qlora("sdpa"), "4.39.3", checkpointed=True) == 0


def _old_python() -> str:
    path = os.environ.get("PERFGUIDE_STACK439_PYTHON", "/tmp/venv439/bin/python")
    if not Path(path).exists():
        pytest.skip(f"no venv with transformers 4.39.3 + peft 0.10.0 at {path} (PERFGUIDE_STACK439_PYTHON)")
    return path


_MEASURE = """
import json, sys
sys.path.insert(0, {scripts!r})
import trace_block_backward as t
print(json.dumps(t.per_token_marks("fp32_stream", 128, 448, True, 128, 256, keep_inputs={keep})))
"""


def _marks(python: str, keep: bool) -> list[float]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([python, "-c", _MEASURE.format(scripts=str(ROOT / "scripts"), keep=keep)], env=env,
                         capture_output=True, text=True, timeout=600, check=True).stdout
    return list(json.loads(out.strip().splitlines()[-1]))[:3]   # between, saved mark, peak (not the saved tensors)


def test_the_april_2024_stack_saves_the_repeated_kv_and_nothing_per_ffn_unit() -> None:
    """Real CPU tensors, nf4 after peft's kbit upcast, bf16 autocast, reentrant, h 128 (4 heads of 32, 1 key/value
    head), FFN 448: transformers 4.39.3 + peft 0.10.0 against the installed releases. The recompute saves the
    repeated keys and values (4 x (128 - 32) B: 4.39.3's sdpa path repeats as its FA2 path does) and the per-layer
    fp32 rotary cos/sin (2 x 4 x 32 B; the installed release builds them once per step) more, to the byte; the
    backward's rise above the recompute is the same. With MatMul4Bit keeping its input (bitsandbytes before 0.43.2,
    priced by bnb_inputs.quantized_matmul_keeps_inputs) both stacks save the same bytes more."""
    old = _old_python()
    new = sys.executable
    (_, o_saved, o_peak), (_, n_saved, n_peak) = _marks(old, False), _marks(new, False)
    counted = 4 * (128 - 32) + 2 * 4 * 32
    assert o_saved - n_saved == counted == 640
    assert o_peak - o_saved == n_peak - n_saved
    (_, ok_saved, _), (_, nk_saved, _) = _marks(old, True), _marks(new, True)
    assert ok_saved - o_saved == nk_saved - n_saved > 0
