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
