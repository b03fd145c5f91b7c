"""Bytes that only exist under autocast with an fp32 LM head, and the reserved-bytes reading of Unsloth's
long-context rows (issue 24's long-context class), each against a hand count."""

from __future__ import annotations

import csv
import itertools
from pathlib import Path

from helpers import load_bench

from perfguide.memory.autocast_copies import head_cast_bytes
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup

ROOT = Path(__file__).resolve().parents[1]
LORA = LoraSpec(r=32, alpha=32, target_modules=("self_attn.q_proj",))


def _qlora(**kw: object) -> Setup:
    fields: dict[str, object] = dict(task="train", weights_dtype="nf4", kbit_upcast=True, autocast="bf16", lora=LORA,
                                     micro_batch_size=1, seq_len=4096, gradient_checkpointing=True)
    fields.update(kw)
    return Setup(**fields)  # type: ignore[arg-type]


def test_head_cast_is_the_bf16_copy_of_an_fp32_head_under_autocast() -> None:
    """Llama-3.1-8B: vocabulary 128256 x hidden 4096 x 2 B; none without autocast, none for a 16-bit head."""
    spec = ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    assert head_cast_bytes(spec, _qlora()) == 128256 * 4096 * 2
    assert head_cast_bytes(spec, _qlora(autocast=None)) == 0
    assert head_cast_bytes(spec, _qlora(kbit_upcast=False)) == 0  # the head stays bf16: nothing to cast
    assert head_cast_bytes(spec, _qlora(weights_dtype="bf16", kbit_upcast=False)) == 0


def test_unsloth_lengths_are_a_straight_line_and_the_cached_head_block_is_2_bytes_per_logit() -> None:
    """The Llama-3.1-8B "Hugging Face + FA2" lengths gain the same tokens per GB at every card size (a fitted
    line, not an OOM search per card); below capacity the freed 16-bit head logits stay cached: 2 B per logit."""
    with (ROOT / "bench" / "data" / "published_measurements.csv").open(encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh) if r["source_group"] == "unsloth_long_context"
                and r["value_kind"] == "max_seq_fit" and r["model_hf_id"] == "meta-llama/Llama-3.1-8B"]
    points = sorted((int(r["gpu_type"].split()[0]), int(r["seq_len"])) for r in rows)
    per_gb = [(b - a) / (gb - ga) for (ga, a), (gb, b) in itertools.pairwise(points)]
    assert len(per_gb) == 5 and max(per_gb) - min(per_gb) < 0.2  # 404.75-404.8 tokens per GB at every step
    reserved = load_bench("accuracy_reserved")
    spec = ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    assert reserved.cached_head_block(spec, _qlora()) == 2 * 4096 * 128256
    assert reserved.cached_head_block(spec, _qlora(autocast=None)) == 0  # fp32 head: its block serves the fp32 grads


def test_prefill_logits_before_4_45_by_hand() -> None:
    """Before transformers 4.45 generate's prefill returns every prompt position's logits; Qwen2 upcasts them
    (2 + 4 B per logit), GPT-2 does not (2 B); from 4.45 on only the last position: nothing extra."""
    prefill = load_bench("accuracy_prefill")
    qwen = ModelSpec.from_any("Qwen/Qwen2.5-7B")
    setup = Setup(task="infer", weights_dtype="bf16", micro_batch_size=1, seq_len=30720, new_tokens=2048)
    assert prefill.prompt_logits_bytes(qwen, setup, "4.38.2") == 30720 * 152064 * 6
    assert prefill.prompt_logits_bytes(qwen, setup, "4.46.0") == 0
    gpt2 = ModelSpec.from_any("openai-community/gpt2")
    assert prefill.prompt_logits_bytes(gpt2, setup.replace(seq_len=512), "4.38.2") == 512 * 50257 * 2
    assert prefill.prompt_logits_bytes(qwen, setup.replace(weights_dtype="fp32"), "4.38.2") == 30720 * 152064 * 4
