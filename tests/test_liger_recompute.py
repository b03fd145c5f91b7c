"""Liger's fused SwiGLU and RMSNorm in the block a checkpointed run recomputes in backward.

The recompute keeps what one block keeps without checkpointing, so Liger's kernels keep there what they keep
anywhere: LigerSiLUMulFunction saves gate and up (not act(gate)), LigerRMSNormFunction its input and one fp32 rstd
per row (liger-kernel ops/swiglu.py, ops/rms_norm.py). The hand counts below come from those storage semantics and
the dtypes the block runs in; the trace test runs scripts/trace_block_backward.py's stand-ins for the two kernels on
real CPU tensors at a shape the coefficients were not traced at.
"""

from __future__ import annotations

import pytest

from perfguide import Hardware
from perfguide.memory import estimate_memory
from perfguide.techniques.liger_kernel import block_savings

try:
    from test_block_backward import ALL, _trace_script, llama_spec, qlora
except ImportError:  # pragma: no cover
    from tests.test_block_backward import ALL, _trace_script, llama_spec, qlora

from perfguide.setup import LoraSpec

H, I = 4096, 14336   # Mistral-7B


def _activations(liger: bool, **update: object) -> int:
    spec = llama_spec()
    return estimate_memory(spec, qlora(liger_kernel=liger, **update), Hardware.from_name("a100-80gb")).activations


def test_fp32_stream_recompute_keeps_one_fp32_ffn_tensor_less() -> None:
    """peft's kbit fp32 stream: gate_proj returns fp32, so the act(gate) HF keeps and Liger recomputes is 4 B per FFN
    unit; the norms' input is already fp32 and their weights frozen, so HF keeps no upcast copy: nothing per hidden
    unit. Checkpointed blocks keep only their input, so the recomputed block is the whole difference."""
    assert _activations(False) - _activations(True) == 1 * 4096 * (4 * I + 0 * H)


def test_bf16_base_recompute_keeps_act_gate_and_the_norm_upcasts_less() -> None:
    """bf16 base under bf16 autocast: act(gate) is bf16 (2 B per FFN unit) and each of the two norms keeps an fp32
    upcast of its bf16 input (4 B per hidden unit) that Liger's does not."""
    bf16 = dict(weights_dtype="bf16", kbit_upcast=False)
    assert _activations(False, **bf16) - _activations(True, **bf16) == 1 * 4096 * (2 * I + 2 * 4 * H)


def test_not_checkpointed_fp32_stream_counts_the_same_per_block() -> None:
    """Without checkpointing every block keeps the same less as the recomputed one: 32 blocks of 4 B per FFN unit."""
    assert _activations(False, gradient_checkpointing=False) - _activations(True, gradient_checkpointing=False) \
        == 32 * 1 * 4096 * 4 * I


def test_unpatched_model_type_keeps_hf_recompute() -> None:
    gpt2 = llama_spec().model_copy(update={"model_type": "gpt2"})
    assert block_savings(gpt2, qlora(liger_kernel=True)) == 0


@pytest.mark.parametrize("case", ["fp32_stream", "half_autocast"])
def test_real_tensors_liger_block_keeps_what_the_hook_removes(case: str) -> None:
    """Real CPU tensors, reentrant checkpointing, h 96 and FFN 256 (the coefficients came from h 64, FFN 3.5 h):
    the middle block's peak (recompute + gradients in flight) with liger-kernel's storage semantics is
    block_savings below HF's, and the gradients in flight above the recompute are the same (the SwiGLU backward's
    in-place writes come after the block's peak, down_proj's input-gradient sum)."""
    pytest.importorskip("bitsandbytes")
    trace = _trace_script()
    h, i = 96, 256
    hf_saved, hf_peak = trace.per_token(case, h, i, True, 128, 256)
    lg_saved, lg_peak = trace.per_token(case, h, i, True, 128, 256, liger=True)
    spec = llama_spec(h=h, i=i, vocab=256, layers=3, kv=1, heads=4)
    setup = qlora(lora=LoraSpec(r=8, alpha=16, target_modules=ALL), seq_len=1000, liger_kernel=True,
                  **({} if case == "fp32_stream" else {"weights_dtype": "bf16", "kbit_upcast": False}))
    predicted = block_savings(spec, setup, recomputed=True) / 1000
    assert hf_peak - lg_peak == pytest.approx(predicted, rel=0.02)
    assert hf_saved - lg_saved == pytest.approx(predicted, rel=0.02)
    assert lg_peak - lg_saved == pytest.approx(hf_peak - hf_saved, abs=0.5)


def test_full_finetune_recompute_also_keeps_the_normalised_tensor_less() -> None:
    """A full fine-tune with bf16 weights under bf16 autocast: HF's two norms save their fp32 upcast (4 B) and, the
    weights being trainable, the normalised bf16 tensor (2 B) per hidden unit, Liger's its bf16 input (2 B: its
    in-flight term is measured above its own saved tensors, so that input is priced with them); act(gate) 2 B per
    FFN unit."""
    full = dict(lora=None, weights_dtype="bf16", kbit_upcast=False)
    assert _activations(False, **full) - _activations(True, **full) == 1 * 4096 * (2 * I + 2 * (4 + 2 - 2) * H)
    # fp32 weights under autocast: the norms run on the fp32 stream (their .to(float32) keeps the input itself)
    amp = dict(lora=None, weights_dtype="fp32", kbit_upcast=False)
    assert _activations(False, **amp) - _activations(True, **amp) == 1 * 4096 * (2 * I + 2 * 4 * H)


@pytest.mark.parametrize("case", ["full_half_autocast", "full_fp32_autocast"])
def test_real_tensors_full_finetune_liger_block(case: str) -> None:
    """Real CPU tensors, every weight trainable, reentrant, h 96 and FFN 256: the storages the recompute saves for
    backward (saved_tensors_hooks) are the hook's block_savings less under the Liger stand-ins, and the block's peak
    drops by that plus the in-flight difference memory/block_backward.py prices (HF's product and factor gradients
    against Liger's product gradient alone; each measured above its own saved tensors)."""
    from perfguide.memory.block_backward import block_backward_bytes

    trace = _trace_script()
    h, i = 96, 256
    *_, hf_peak, hf_saved = trace.per_token_marks(case, h, i, True, 128, 256)
    *_, lg_peak, lg_saved = trace.per_token_marks(case, h, i, True, 128, 256, liger=True)
    spec = llama_spec(h=h, i=i, vocab=256, layers=3, kv=1, heads=4)
    setup = qlora(lora=None, kbit_upcast=False, seq_len=1000, liger_kernel=True,
                  weights_dtype="bf16" if case == "full_half_autocast" else "fp32")
    saved_less = block_savings(spec, setup, recomputed=True) / 1000
    assert hf_saved - lg_saved == pytest.approx(saved_less, rel=0.02)
    in_flight_less = (block_backward_bytes(spec, setup, "4.39.3") - block_backward_bytes(spec, setup, "4.39.3", True)) / 1000
    assert hf_peak - lg_peak == pytest.approx(saved_less + in_flight_less, rel=0.02)


def test_not_checkpointed_lora_norms_keep_less_only_their_upcast_net_of_liger_input() -> None:
    """A bf16 base under LoRA, no checkpointing: each norm's fp32 upcast (4 B) is gone, but Liger keeps the 16-bit
    input HF does not (2 B; the norm weights are frozen, so HF keeps no normalised tensor): 2 x (4 - 2) per hidden
    unit per block, not the 8 of the recomputed block, where that input is alive anyway."""
    bf16 = dict(weights_dtype="bf16", kbit_upcast=False, gradient_checkpointing=False)
    assert _activations(False, **bf16) - _activations(True, **bf16) == 32 * 1 * 4096 * (2 * I + 2 * (4 - 2) * H)


@pytest.mark.parametrize("case", ["half_autocast", "full_half_autocast", "full_fp32"])
def test_real_tensors_not_checkpointed_block(case: str) -> None:
    """Real CPU tensors without checkpointing (scripts/trace_liger_unchecked.py), h 96 and FFN 256: what the middle
    block adds to the live bytes up to the next block's start, HF's less the Liger stand-ins', per token, is
    block_savings within 2% (LoRA r 8 on a bf16 base; bf16 and fp32 full fine-tunes)."""
    import importlib.util
    from pathlib import Path

    _trace_script()   # scripts/trace_liger_unchecked.py imports it by name
    path = Path(__file__).resolve().parents[1] / "scripts" / "trace_liger_unchecked.py"
    loader = importlib.util.spec_from_file_location("trace_liger_unchecked", path)
    assert loader is not None and loader.loader is not None
    unchecked = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(unchecked)
    h, i = 96, 256
    less = [unchecked.block_kept(case, h, i, False, s) - unchecked.block_kept(case, h, i, True, s) for s in (128, 256)]
    spec = llama_spec(h=h, i=i, vocab=256, layers=3, kv=1, heads=4)
    update: dict[str, object] = {"lora": LoraSpec(r=8, alpha=16, target_modules=ALL)} if case == "half_autocast" else {"lora": None}
    setup = qlora(kbit_upcast=False, seq_len=1000, liger_kernel=True, gradient_checkpointing=False,
                  weights_dtype="fp32" if case == "full_fp32" else "bf16", autocast=None if case == "full_fp32" else "bf16", **update)
    assert (less[1] - less[0]) / 128 == pytest.approx(block_savings(spec, setup) / 1000, rel=0.02)
