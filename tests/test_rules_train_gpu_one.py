"""train_gpu_one rules: precision, the memory ladder, the fixed global batch, constraints and the no-fit path.

Hardware is built by hand from the datasheets (A100 80 GB, A100 40 GB, T4 16 GB); bytes that decide the ladder
are computed here from the parameter count, never read back from perfguide.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_speed import A100, CPU32, LLAMA_TOTAL, T4, GiB, gpt2, llama7b

import perfguide
from perfguide.errors import ConflictingConstraintsError, PerfGuideError
from perfguide.hardware.types import GPU, Hardware
from perfguide.scenarios.train_gpu_one import plan
from perfguide.scenarios.types import Constraints, Request

A100_40 = A100.model_copy(update={"name": "A100-SXM4-40GB", "memory_total": 40 * GiB, "memory_free": 40 * GiB, "memory_bandwidth_gbps": 1555})


def hw(gpu: GPU = A100) -> Hardware:
    return Hardware(gpus=(gpu,), cpu=CPU32, source="named", name=gpu.name)


def run(spec=None, gpu: GPU = A100, seq: int = 1024, batch: int = 32, **cons):
    return plan(Request(scenario="train_gpu_one", model=spec or gpt2(), hardware=hw(gpu), seq_len=seq,
                        global_batch_size=batch, constraints=Constraints(**cons)))


def decision(p, setting: str):
    return next(d for d in p.decisions if d.setting == setting)


def test_gpt2_on_a100_is_bf16_amp_tf32_fused_adamw_no_checkpointing() -> None:
    p = run()
    s = p.setup
    assert p.fits
    assert (s.autocast, s.weights_dtype, s.tf32) == ("bf16", "fp32", True)
    assert s.optimizer == "adamw_torch_fused"
    assert not s.gradient_checkpointing and s.lora is None
    assert s.micro_batch_size * s.gradient_accumulation_steps == 32
    assert decision(p, "mixed_precision").value == "bf16"
    assert decision(p, "activation_checkpointing").value is False
    # 124M params x 16 B (fp32 weights + grads + 2 AdamW states) = 2.0 GB: states never limit gpt2 on 80 GB
    assert p.memory.weights + p.memory.gradients + p.memory.optimizer_states == 16 * 124_439_808
    assert next(c for c in p.candidates if c.verdict == "chosen").setup == s


def test_7b_full_finetune_on_a100_80gb_needs_the_ladder() -> None:
    # fp32 master weights + fp32 grads + 2 fp32 AdamW states = 16 B/param: 16 * 6.74e9 = 107.8 GB > 80 GiB (85.9 GB)
    assert 16 * LLAMA_TOTAL > 80 * GiB
    p = run(llama7b(), seq=2048)
    s = p.setup
    assert p.fits
    exact = s.weights_dtype == "fp32" and s.optimizer in ("adamw_torch_fused", "adamw_torch") and s.lora is None
    assert not exact
    assert s.optimizer in ("adamw_bnb_8bit", "adafactor") or s.weights_dtype == "bf16"
    assert s.autocast == "bf16"
    assert p.memory.needed <= 0.9 * 80 * GiB
    assert any(c.verdict == "does-not-fit" and c.setup.optimizer == "adamw_torch_fused" and c.setup.weights_dtype == "fp32"
               for c in p.candidates)
    # fp32 masters + 8-bit AdamW (4 + 4 + 2 B/param = 67 GB) would fit but for autocast's weight cache: a checkpointed
    # forward ends with a bf16 copy of every trainable Linear (2 B x 6.5e9 = 13 GB; autocast_copies.autocast_cached_casts)
    fp32_8bit_ckpt = [c for c in p.candidates if c.setup.weights_dtype == "fp32" and c.setup.optimizer == "adamw_bnb_8bit"
                      and c.setup.gradient_checkpointing]
    assert fp32_8bit_ckpt and all(c.verdict == "does-not-fit" for c in fp32_8bit_ckpt)
    optim = decision(p, "optim")
    assert any(a.value == "adamw_torch_fused" and ("does not fit" in a.why_not or "s/step" in a.why_not)
               for a in optim.alternatives)


def test_7b_on_a100_40gb_goes_past_lighter_optimizers() -> None:
    # 8-bit AdamW with fp32 masters: 4 + 4 + 2 = 10 B/param = 67 GB > 40 GiB; pure bf16 + 8-bit: 2 + 2 + 2 = 6 B = 40.4 GB > 36 GiB usable
    assert 10 * LLAMA_TOTAL > 40 * GiB and 6 * LLAMA_TOTAL > 0.9 * 40 * GiB
    p = run(llama7b(), gpu=A100_40, seq=2048)
    # ... so the ladder goes on: pure bf16 with the optimizer step inside backward (no gradients held beyond one
    # tensor; no accumulation, so the whole batch is one micro-batch) and the techniques that make it fit
    assert p.fits and p.setup.optimizer_in_backward and p.setup.weights_dtype == "bf16"
    assert (p.setup.micro_batch_size, p.setup.gradient_accumulation_steps) == (32, 1)
    assert p.memory.gradients < 0.02 * 2 * LLAMA_TOTAL      # one gradient alive, not 2 B/param
    assert p.setup.micro_batch_size * p.setup.gradient_accumulation_steps == 32


def test_t4_with_bf16_native_model_is_not_fp16() -> None:
    tiny_bf16 = gpt2().model_copy(update={"native_dtype": "bf16"})
    p = run(tiny_bf16, gpu=T4)
    assert p.setup.autocast != "fp16"
    assert p.setup.autocast != "bf16"          # no bf16 tensor cores on cc 7.5
    assert p.setup.tf32 is False
    assert any("bf16" in w for w in p.warnings)


def test_t4_with_fp32_model_uses_fp16_amp() -> None:
    p = run(gpu=T4)
    assert (p.setup.autocast, p.setup.weights_dtype, p.setup.tf32) == ("fp16", "fp32", False)


def test_bf16_forced_on_t4_is_honoured_and_warned() -> None:
    """torch emulates bf16 on cc 7.5 and transformers accepts it (is_bf16_supported counts emulation): it runs, slowly."""
    p = run(gpu=T4, precision="bf16")
    assert p.setup.autocast == "bf16" and any("emulat" in w for w in p.warnings)


def test_fp16_forced_on_a_family_without_an_fp16_record_is_honoured_and_warned() -> None:
    """A bf16-trained family with no fp16 record either way runs in fp16 (it may overflow, it may not): warned, not refused."""
    olmo = llama7b().model_copy(update={"model_type": "olmo2", "family": "olmo2"})
    p = run(olmo, gpu=T4, seq=512, precision="fp16", finetune="lora")
    assert p.setup.autocast == "fp16" and any("no fp16 record" in w for w in p.warnings)


def test_fp16_forced_on_bf16_native_model_conflicts_only_where_the_family_overflows() -> None:
    gemma_like = llama7b().model_copy(update={"model_type": "gemma", "family": "gemma"})
    with pytest.raises(ConflictingConstraintsError, match="bf16"):
        run(gemma_like, seq=512, precision="fp16")
    # Llama-family checkpoints fine-tune in fp16 AMP (issue 11): honoured, with a warning to watch for NaN
    p = run(llama7b(), seq=512, precision="fp16")
    assert p.setup.autocast == "fp16" and any("inf/NaN" in w for w in p.warnings)


def test_micro_batch_that_does_not_divide_global_conflicts() -> None:
    with pytest.raises(ConflictingConstraintsError, match="does not divide"):
        run(batch=32, micro_batch_size=3)


def test_unknown_optimizer_is_one_line_error() -> None:
    with pytest.raises(PerfGuideError) as err:
        run(optimizer="adamw_hf")
    assert "\n" not in str(err.value) and "adamw_torch_fused" in str(err.value)


def test_flash_attention_on_t4_conflicts() -> None:
    with pytest.raises(ConflictingConstraintsError, match="flash_attention_2"):
        run(gpu=T4, attn_implementation="flash_attention_2")


def test_forced_constraints_are_honoured() -> None:
    p = run(micro_batch_size=4, gradient_checkpointing=True, optimizer="sgd", precision="fp32", attn_implementation="eager")
    s = p.setup
    assert (s.micro_batch_size, s.gradient_accumulation_steps) == (4, 8)
    assert s.gradient_checkpointing and s.optimizer == "sgd" and s.autocast is None and s.attn_implementation == "eager"


def test_lora_and_qlora_modes() -> None:
    lora = run(llama7b(), seq=2048, finetune="lora")
    assert lora.setup.lora is not None and lora.setup.weights_dtype == "bf16" and lora.fits
    q = run(llama7b(), gpu=T4, seq=1024, finetune="qlora")
    assert q.setup.weights_dtype == "nf4" and q.setup.lora is not None


def test_nothing_fits_never_raises_and_says_what_would() -> None:
    # with ZeRO-Offload a 7B trains on a T4 (host RAM allowing); without offload nothing fits there
    p = run(llama7b(), gpu=T4, seq=2048, allow_offload=False)
    assert p.fits is False
    assert any("qlora" in s for s in p.suggestions)
    assert any("FSDP" in s or "hardware=" in s for s in p.suggestions)


def test_headroom_is_kept() -> None:
    for headroom in (0.05, 0.3):
        p = run(llama7b(), seq=2048, headroom=headroom)
        if p.fits:
            assert p.memory.needed <= (1 - headroom) * 80 * GiB


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(min_value=1, max_value=512), seq=st.sampled_from([128, 512, 1000, 1024]))
def test_global_batch_is_always_kept(batch: int, seq: int) -> None:
    s = run(seq=seq, batch=batch).setup
    assert s.micro_batch_size * s.gradient_accumulation_steps * s.world_size == batch


def test_deterministic() -> None:
    assert run(llama7b(), seq=2048).model_dump() == run(llama7b(), seq=2048).model_dump()


def test_every_decision_has_a_reason() -> None:
    p = run()
    settings_ = {d.setting for d in p.decisions}
    assert {"per_device_train_batch_size", "gradient_accumulation_steps", "mixed_precision", "tf32", "optim",
            "activation_checkpointing", "attn_implementation", "finetune", "dataloader_num_workers", "dataloader_pin_memory"} <= settings_
    assert all(d.reason for d in p.decisions)


def test_public_recommend_on_named_hardware() -> None:
    rec = perfguide.recommend("gpt2", hardware="a100-80gb", seq_len=1024, global_batch_size=64)
    assert rec.setup.autocast == "bf16" and rec.setup.global_batch_size == 64 and rec.fits


def test_a_rejected_micro_batch_names_the_limit_it_breaks():
    """8B full fine-tune on an L4 offloads to host RAM: a bigger micro-batch that still fits the GPU is refused for
    the node's RAM, and the reason must say so with numbers that really exceed the limit (not 'needs 18.5 GiB >
    20.2 GiB usable')."""
    from perfguide.hardware.named import hardware_from_name
    from perfguide.scenarios.search import usable_bytes, usable_ram

    rec = perfguide.recommend("meta-llama/Llama-3.1-8B", scenario="train_gpu_one", hardware="l4", host_ram="256GiB")
    hw = hardware_from_name("l4", "256GiB")
    alts = rec.decision("per_device_train_batch_size").alternatives
    assert alts, "a bigger micro-batch was tried and refused"
    for alt in alts:
        limit = usable_ram(hw, 0.10) if "host RAM" in alt.why_not else usable_bytes(rec.memory, 0.10)
        assert limit is not None and alt.number > limit, (alt.why_not, alt.number, limit)


def test_a_full_fine_tune_refused_at_the_default_batch_names_a_smaller_batch_that_fits():
    """On a 64 GiB desktop an 8B full fine-tune at 32 samples/step needs ZeRO-Offload's ~150 GiB of host RAM; without
    accumulation the optimizer steps inside backward, as torchtune's recipe runs it at batch 2 on one RTX 4090
    (README memory table). The suggestion is offered, never chosen, and holds when the user takes it."""
    import re

    rec = perfguide.recommend("meta-llama/Llama-3.1-8B", "train_gpu_one", hardware="rtx4090", seq_len=2048, host_ram="64GiB")
    assert not rec.fits and rec.setup.global_batch_size == 32
    [hint] = [s for s in rec.suggestions if s.startswith("global_batch_size=")]
    k = int(re.match(r"global_batch_size=(\d+)", hint).group(1))
    assert 2 <= k < 32
    taken = perfguide.recommend("meta-llama/Llama-3.1-8B", "train_gpu_one", hardware="rtx4090", seq_len=2048, host_ram="64GiB",
                         global_batch_size=k)
    assert taken.fits and taken.setup.lora is None and taken.setup.gradient_accumulation_steps == 1
    bigger = perfguide.recommend("meta-llama/Llama-3.1-8B", "train_gpu_one", hardware="rtx4090", seq_len=2048, host_ram="64GiB",
                          global_batch_size=2 * k)
    assert not bigger.fits   # the largest such batch is named
