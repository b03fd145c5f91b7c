"""The bitsandbytes capability flags gate every place perfguide would choose bnb: the QLoRA rung, the 8-bit and
paged optimizers, int8/nf4 inference and vLLM's bitsandbytes format.

bitsandbytes 0.50 ships ROCm wheels for CDNA gfx90a/gfx942 (MI300X's row says so), so the AMD case is the MI300X
row with its flag off, as a target without those wheels (an older bitsandbytes, a card outside their targets)
is described; the V100's llm_int8=false (LLM.int8() needs cc 7.5, bitsandbytes installation guide) is a real row.
"""

from __future__ import annotations

import pytest

from perfguide import Hardware, recommend
from perfguide.errors import ConflictingConstraintsError
from perfguide.optimizer_facts import rows
from perfguide.scenarios.bnb_gate import bnb_optimizers
from perfguide.setup import Setup

BNB_WEIGHTS = ("int8", "nf4")


def _without_bnb(name: str) -> Hardware:
    hw = Hardware.from_name(name)
    gpus = tuple(g.model_copy(update={"capabilities": g.capabilities.model_copy(update={"bitsandbytes": False, "llm_int8": False})})
                 for g in hw.gpus)
    return hw.model_copy(update={"gpus": gpus})


def _uses_bnb(setup: Setup) -> bool:
    return setup.weights_dtype in BNB_WEIGHTS or setup.optimizer in bnb_optimizers()


def test_the_bnb_optimizer_list_comes_from_the_package_column() -> None:
    names = set(bnb_optimizers())
    assert {"adamw_bnb_8bit", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit"} <= names
    assert "adamw_torch_fused" not in names and "adafactor" not in names
    assert all(rows()[n].package == "bitsandbytes" for n in names)


def test_mi300x_row_runs_bnb_as_its_release_says() -> None:
    gpu = Hardware.from_name("mi300x").gpus[0]
    assert gpu.vendor == "amd" and gpu.capabilities.bitsandbytes and gpu.capabilities.llm_int8


def test_a_tight_full_finetune_never_lands_on_a_bnb_rung_without_the_flag() -> None:
    """Llama-3.1-70B on one 192 GB card: with bnb the ladder may use 8-bit AdamW; without the flag no candidate uses bnb."""
    with_flag = recommend("meta-llama/Llama-3.1-70B", hardware="mi300x", seq_len=1024, global_batch_size=8)
    without = recommend("meta-llama/Llama-3.1-70B", hardware=_without_bnb("mi300x"), seq_len=1024, global_batch_size=8)
    assert any(_uses_bnb(c.setup) for c in with_flag.candidates)  # the gate has something to remove
    assert not _uses_bnb(without.setup)
    assert not any(_uses_bnb(c.setup) for c in without.candidates)


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"finetune": "qlora"}, "finetune='qlora'"),
    ({"optimizer": "paged_adamw_8bit"}, "optimizer='paged_adamw_8bit'"),
    ({"optimizer": "adamw_8bit"}, "optimizer='adamw_8bit'"),
    ({"optimizer": "adamw_bnb_8bit"}, "optimizer='adamw_bnb_8bit'"),
])
def test_asking_for_bnb_training_is_one_line_naming_the_flag(kwargs: dict[str, str], named: str) -> None:
    with pytest.raises(ConflictingConstraintsError) as err:
        recommend("meta-llama/Llama-3.1-8B", hardware=_without_bnb("mi300x"), seq_len=512, global_batch_size=8, **kwargs)
    text = str(err.value)
    assert "\n" not in text and named in text and "capabilities.bitsandbytes=false" in text and "use " in text


@pytest.mark.parametrize("q", BNB_WEIGHTS)
def test_asking_for_bnb_inference_is_one_line_naming_the_flag(q: str) -> None:
    with pytest.raises(ConflictingConstraintsError) as err:
        recommend("meta-llama/Llama-3.1-8B", "infer_gpu_one", hardware=_without_bnb("mi300x"), quantization=q)
    flag = "llm_int8" if q == "int8" else "bitsandbytes"
    assert f"capabilities.{flag}=false" in str(err.value) and f"quantization={q!r}" in str(err.value)


def test_inference_that_needs_quantizing_skips_int8_where_llm_int8_is_off() -> None:
    """Llama-2-13b (26 GB in fp16) on a 16 GB V100: with LLM.int8() unavailable (cc 7.0) the step is NF4, not int8."""
    rec = recommend("meta-llama/Llama-2-13b-hf", "infer_gpu_one", hardware="v100-16gb", prompt_len=512, max_new_tokens=64)
    assert not Hardware.from_name("v100-16gb").gpus[0].capabilities.llm_int8
    assert rec.setup.weights_dtype == "nf4"
    assert all(c.setup.weights_dtype != "int8" for c in rec.candidates)
    with pytest.raises(ConflictingConstraintsError, match=r"capabilities\.llm_int8=false.*quantization='nf4'"):
        recommend("meta-llama/Llama-2-13b-hf", "infer_gpu_one", hardware="v100-16gb", quantization="int8")


def test_inference_without_any_bnb_never_quantizes_with_it() -> None:
    rec = recommend("meta-llama/Llama-3.1-70B", "infer_gpu_one", hardware=_without_bnb("mi300x"), prompt_len=512, max_new_tokens=64)
    assert rec.setup.weights_dtype not in BNB_WEIGHTS
    assert all(c.setup.weights_dtype not in BNB_WEIGHTS for c in rec.candidates)


def test_vllm_on_amd_plans_the_formats_its_rocm_kernels_run() -> None:
    """vLLM's quantization hardware table, AMD GPU column: FP8 runs, AWQ / GPTQ / bitsandbytes do not."""
    rec = recommend("meta-llama/Llama-3.1-70B", "infer_gpu_one", hardware="mi300x", engine="vllm", quantization="auto")
    formats = {c.setup.serving.weight_format for c in rec.candidates if c.setup.serving}
    assert formats == {"bf16", "fp8"} and rec.fits
    for q in ("awq", "gptq"):
        with pytest.raises(ConflictingConstraintsError, match=r"does not run on mi300x \(AMD\)"):
            recommend("meta-llama/Llama-3.1-70B", "infer_gpu_one", hardware="mi300x", engine="vllm", quantization=q,
                      quantized_model=f"someone/Llama-3.1-70B-{q.upper()}")


def test_vllm_bitsandbytes_format_follows_the_flag() -> None:
    """70B on one 48 GB card under SGLang (vLLM 0.33 has no bitsandbytes format): with the flag bitsandbytes 4-bit
    is among the formats priced; without it, never."""
    with_flag = recommend("meta-llama/Llama-3.1-70B", "infer_gpu_one", hardware="a6000", engine="sglang")
    without = recommend("meta-llama/Llama-3.1-70B", "infer_gpu_one", hardware=_without_bnb("a6000"), engine="sglang")
    assert "nf4" in {c.setup.serving.weight_format for c in with_flag.candidates if c.setup.serving}
    assert "nf4" not in {c.setup.serving.weight_format for c in without.candidates if c.setup.serving}
