"""Cut Cross-Entropy (techniques/cut_cross_entropy.py): its bytes against the package's own published benchmark and
hand counts of cce.py's allocations, its reading from axolotl's plugin, and what a plan that runs it emits."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import perfguide
from perfguide.errors import ConflictingConstraintsError, MissingDependencyError
from perfguide.techniques.cut_cross_entropy import cce_parts

MiB = 2**20
DATA = Path(__file__).parent / "data" / "check"
PLUGIN = "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"


def test_bytes_match_the_packages_published_benchmark() -> None:
    """apple/ml-cross-entropy's README table (A100-SXM4, torch 2.4.1, ``python -m benchmark``; benchmark/memory.py
    reports the allocator's peak minus the allocated bytes at the start, in MiB): gemma-2-2b-it's head (2304 x 256000,
    bf16, both inputs requiring grad) over 8,192 valid positions, targets given unshifted. cce: loss-fw 1.1,
    loss-bw 1163.0, loss-fw-bw 1164.0."""
    parts = cce_parts(positions=8192, hidden=2304, vocab=256_000, hidden_bytes=2, head_trains=True, shifted=False)
    assert parts.forward / MiB == pytest.approx(1.1, abs=0.1)
    assert (parts.backward + parts.head_grad) / MiB == pytest.approx(1163.0, rel=0.005)
    assert (parts.saved + parts.backward + parts.head_grad) / MiB == pytest.approx(1164.0, rel=0.005)
    # the baseline it replaces: 3 fp32 copies of the logits in forward (24000 MiB in the same table), which perfguide's
    # own loss path prices for a 16-bit soft-capped head (the README's reference is HF's Gemma 2 head and loss)
    assert 3 * 8192 * 256_000 * 4 / MiB == pytest.approx(24000.0)
    from perfguide.memory.loss_path import loss_path_phases
    from perfguide.memory.softcap import final_softcap_bytes

    spec = perfguide.ModelSpec.from_any("google/gemma-2-2b")
    setup = perfguide.Setup(weights_dtype="bf16", micro_batch_size=1, seq_len=8192)
    forward, _ = loss_path_phases(setup, "4.48.2", loop_keeps_outputs=False)
    assert (forward * 8192 * 256_000 + final_softcap_bytes(spec, setup)) / MiB == pytest.approx(24000.0)


def _axolotl(tmp_path: Path, **extra: object) -> Path:
    y = {**yaml.safe_load((DATA / "axolotl_qlora-1b.yml").read_text(encoding="utf-8")), "plugins": [PLUGIN], **extra}
    path = tmp_path / "cce.yml"
    path.write_text(yaml.safe_dump(y), encoding="utf-8")
    return path


@pytest.mark.parametrize("switch", [None, True, False])
def test_axolotl_plugin_is_read_and_priced(switch: bool | None, tmp_path: Path) -> None:
    """The plugin's ``cut_cross_entropy`` defaults to true once listed. Priced, the loss term is cce.py's
    allocations counted by hand for the YAML's 2 x 2048 tokens of Llama-3.2-1B (hidden 2048, vocabulary 128256):
    the forward's lse, target logit and int32 positions (after an int64 nonzero of the 2-D targets, 24 B per
    position) and the fp32 logit average per entry; the backward's saved lse and positions, the bf16 hidden
    gradient and the vocabulary ordering (argsort's int64 and int32, 12 B per entry); the frozen head has none."""
    path = _axolotl(tmp_path, **({} if switch is None else {"cut_cross_entropy": switch}))
    c = perfguide.check("meta-llama/Llama-3.2-1B", path, hardware="a100-80gb")
    plain = perfguide.check("meta-llama/Llama-3.2-1B", DATA / "axolotl_qlora-1b.yml", hardware="a100-80gb")
    assert c.setup.cut_cross_entropy is (switch is not False)
    if switch is False:
        assert c.memory.logits == plain.memory.logits
        return
    n, h, v = 2 * 2048, 2048, 128_256
    forward = 24 * n + 4 * v
    backward = (4 + 4) * n + 4 * v + n * h * 2 + 12 * v
    assert c.memory.logits == max(forward, backward)
    assert plain.memory.logits >= 12 * n * v   # HF's loss: 12 B per logit at its backward, at least
    assert c.memory.peak_allocated < plain.memory.peak_allocated - 10 * n * v


def test_forced_plan_emits_the_patch_and_turns_liger_loss_off(tmp_path: Path) -> None:
    """Forced, the plan prices CCE's loss, and where Liger runs too its fused cross-entropy is switched off in the
    TrainingArguments (the patched forward would be replaced), which the real TrainingArguments accepts."""
    from transformers import TrainingArguments

    rec = perfguide.recommend("meta-llama/Llama-3.1-8B", scenario="train_gpu_one", hardware="a100-80gb", cut_cross_entropy=True,
                              liger_kernel=True, seq_len=4096)
    assert rec.setup.cut_cross_entropy and rec.setup.liger_kernel and "cce" in rec.setup.label
    kw = {k: v for k, v in rec.training_args_dict().items() if k not in ("bf16", "tf32", "optim")}   # CUDA-only here
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], **kw)
    assert args.use_liger_kernel and args.liger_kernel_config == {"fused_linear_cross_entropy": False}


def test_prepare_model_names_the_missing_package() -> None:
    """cut-cross-entropy needs Triton and a CUDA GPU; where it is not installed ``prepare_model`` says how to get it."""
    pytest.importorskip("transformers")
    try:
        import cut_cross_entropy  # noqa: F401
        pytest.skip("cut-cross-entropy is installed here")
    except ModuleNotFoundError:
        pass
    rec = perfguide.recommend("meta-llama/Llama-3.2-1B", scenario="train_gpu_one", hardware="a100-80gb", cut_cross_entropy=True)
    with pytest.raises(MissingDependencyError, match="pip install 'cut-cross-entropy"):
        rec.prepare_model(object())


@pytest.mark.parametrize(("model", "hardware", "words"), [
    ("gpt2", "a100-80gb", "no patch for model type 'gpt2'"),
    ("meta-llama/Llama-3.2-1B", "v100-32gb", "needs bf16 on the GPU"),
])
def test_forced_where_it_cannot_run_is_a_clear_error(model: str, hardware: str, words: str) -> None:
    with pytest.raises(ConflictingConstraintsError, match=words):
        perfguide.recommend(model, scenario="train_gpu_one", hardware=hardware, cut_cross_entropy=True)


def test_cpu_setup_is_refused() -> None:
    with pytest.raises(ValueError, match="cut_cross_entropy needs a cuda device"):
        perfguide.Setup(device="cpu", cut_cross_entropy=True)


def test_axolotl_plugin_without_half_precision_is_refused(tmp_path: Path) -> None:
    """axolotl's CutCrossEntropyArgs refuses the plugin without bf16 or fp16 training (check_dtype_is_half); so does the
    check, in one line naming the key, instead of pricing a run that never starts."""
    path = _axolotl(tmp_path, bf16=False, fp16=False)
    with pytest.raises(perfguide.PerfGuideError, match="CutCrossEntropyPlugin needs bf16 or fp16"):
        perfguide.check("meta-llama/Llama-3.2-1B", path, hardware="a100-80gb")


def test_axolotl_liger_norms_beside_cce_are_priced(tmp_path: Path) -> None:
    """axolotl's recent examples pair the CCE plugin with the LigerPlugin's RMSNorm and GLU kernels, its fused loss
    left off (examples/gemma4/31b-qlora.yaml): read as Liger's kernels with CCE's loss, the keys priced, not ignored.
    The Liger kernels without CCE (HF's loss beside them) are not a Setup perfguide has: ignored, as before."""
    liger = {"liger_rms_norm": True, "liger_glu_activation": True}
    path = _axolotl(tmp_path, plugins=[PLUGIN, "axolotl.integrations.liger.LigerPlugin"], **liger)
    c = perfguide.check("meta-llama/Llama-3.2-1B", path, hardware="a100-80gb")
    assert c.setup.cut_cross_entropy and c.setup.liger_kernel
    assert not [i for i in c.ignored if "liger_rms_norm" in i or "liger_glu_activation" in i]
    cce_only = perfguide.check("meta-llama/Llama-3.2-1B", _axolotl(tmp_path), hardware="a100-80gb")
    assert c.memory.logits == cce_only.memory.logits   # the loss is CCE's either way
    assert c.memory.activations < cce_only.memory.activations   # Liger's norms and SwiGLU keep less
    no_cce = _axolotl(tmp_path, plugins=["axolotl.integrations.liger.LigerPlugin"], **liger)
    plain = perfguide.check("meta-llama/Llama-3.2-1B", no_cce, hardware="a100-80gb")
    assert not plain.setup.liger_kernel and not plain.setup.cut_cross_entropy
    assert [i for i in plain.ignored if i.endswith("liger_rms_norm")]


@pytest.mark.parametrize(("weights", "accumulation", "head_extra"), [
    ("bf16", 1, 0),                     # pure bf16, first micro-step: dc becomes .grad itself
    ("bf16", 4, 2),                     # accumulating: dc (bf16) beside .grad until autograd adds it in
    ("fp32", 1, 2),                     # fp32 head under autocast: dc in bf16, cast to fp32 by autograd's engine
    ("fp32", 4, 2 + 4),                 # ... and accumulating: the fp32 cast too beside the fp32 .grad
])
def test_full_finetune_head_gradient_buffers(weights: str, accumulation: int, head_extra: int) -> None:
    """A trained head: cce_backward's ``dc = zeros_like(c)`` in c's dtype (the autocast copy's bf16 for an fp32 head),
    which autograd's engine casts to the weight's dtype (validate_outputs) and AccumulateGrad adds into an existing
    ``.grad``. Bytes by hand per head element on top of the hidden-state terms (Llama-3.2-1B, 2 x 1024 tokens)."""
    setup = {"micro_batch_size": 2, "seq_len": 1024, "weights_dtype": weights, "gradient_accumulation_steps": accumulation,
             "cut_cross_entropy": True, **({"autocast": "bf16"} if weights == "fp32" else {})}
    est = perfguide.estimate("meta-llama/Llama-3.2-1B", setup, hardware="a100-80gb")
    n, h, v = 2048, 2048, 128_256
    backward = (4 + 4) * n + 4 * v + n * h * 2 + 12 * v + head_extra * v * h
    assert est.logits == max(24 * n + 4 * v, backward)


def test_refused_where_trl_runs_its_own_loss() -> None:
    """TRL >= 1.7's SFT loss and DPO's log-probs score tokens with TRL's own head: the patched forward's loss never
    runs there, so forcing CCE is a one-line error, not a plan priced as if it ran (TRL 1.16 is installed here)."""
    for objective in ("sft", "dpo"):
        with pytest.raises(ValueError, match="TRL's trainer does not run here"):
            perfguide.Setup(trainer="trl", objective=objective, cut_cross_entropy=True)
    assert perfguide.Setup(trainer="transformers", cut_cross_entropy=True).cut_cross_entropy


def test_priced_for_any_decoder_lm_emitted_for_the_packages_types() -> None:
    """axolotl's fork patches any llama-like causal LM, so a Setup on CCE is priced for Qwen3 (estimate, check);
    a plan forcing it must apply the package's own cce_patch, which has no qwen3 patch: refused there, in one line.
    An encoder is not a causal LM: refused for pricing too."""
    setup = {"micro_batch_size": 1, "seq_len": 1024, "weights_dtype": "bf16", "cut_cross_entropy": True}
    est = perfguide.estimate("Qwen/Qwen3-0.6B", setup, hardware="a100-80gb")
    assert est.logits < 1024 * 151_936 * 2   # below even one 16-bit copy of the logits: CCE's path, not HF's
    with pytest.raises(ConflictingConstraintsError, match="no patch for model type 'qwen3'"):
        perfguide.recommend("Qwen/Qwen3-0.6B", scenario="train_gpu_one", hardware="a100-80gb", cut_cross_entropy=True)
    with pytest.raises(perfguide.PerfGuideError, match="'bert' is not a causal LM"):
        perfguide.estimate("google-bert/bert-base-uncased", {**setup, "weights_dtype": "fp32"}, hardware="a100-80gb")
