"""estimate() of a tensor-parallel inference setup whose degree does not divide the attention heads."""

from __future__ import annotations

import pytest

import perfguide
from perfguide.cli import main
from perfguide.errors import InvalidSetupError

# Llama-3.1-8B config.json (https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json):
# num_attention_heads 32, num_key_value_heads 8; a TP degree shards whole heads, so it must divide both
SETUP = {"task": "infer", "strategy": "tp", "weights_dtype": "bf16", "optimizer": None}


def test_tp_degree_that_splits_a_head_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InvalidSetupError, match="8 KV heads"):
        perfguide.estimate("meta-llama/Llama-3.1-8B", SETUP | {"num_gpus": 3}, hardware="a100-80gb:3")
    code = main(["estimate", "meta-llama/Llama-3.1-8B", "--hardware", "a100-80gb:3", "--task", "infer",
                 "--strategy", "tp", "--num-gpus", "3"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error:") and "Traceback" not in err


def test_tp_degree_that_divides_the_heads_is_priced() -> None:
    mem = perfguide.estimate("meta-llama/Llama-3.1-8B", SETUP | {"num_gpus": 4}, hardware="a100-80gb:4")
    assert mem.fits


def test_tp_shards_the_routed_experts_where_the_model_tp_plan_does() -> None:
    # Qwen3-30B-A3B: 30.53B params, 28.99B of them routed experts (fused 3-D tensors in transformers 5). Its config's
    # base_model_tp_plan shards them ("layers.*.mlp.experts.gate_up_proj": "packed_colwise", "down_proj": "rowwise"),
    # so a TP=4 rank holds ~1/4 of the 61.06 GB of bf16 weights. gpt-oss's plan shards only embed_tokens: its 19.1B
    # expert weights (2 B each in bf16) stay whole on every rank
    mem = perfguide.estimate("Qwen/Qwen3-30B-A3B", SETUP | {"num_gpus": 4, "micro_batch_size": 1}, hardware="l4:4")
    assert abs(mem.weights - 2 * 30_532_122_624 / 4) < 0.01 * 2 * 30_532_122_624 / 4
    oss = perfguide.estimate("openai/gpt-oss-20b", SETUP | {"num_gpus": 4, "micro_batch_size": 1}, hardware="h100-80gb:4")
    whole = perfguide.estimate("openai/gpt-oss-20b", SETUP | {"strategy": "single", "num_gpus": 1, "micro_batch_size": 1},
                               hardware="h100-80gb")
    assert oss.weights > 0.8 * whole.weights  # 19.1B of 20.9B params replicated: over 80% of the bytes on every rank
