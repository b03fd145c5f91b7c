"""trainer='trl': TRL's SFT loss path by release, counted by hand on the tiny Llama, the era table read by version, the
one-line refusals, and a trainer='trl' plan's ``rec.sft_config()`` training a real SFTTrainer on CPU.

Hand counts use the tiny Llama's dimensions (tests/helpers.py TINY_LLAMA: V 128, H 32, untied head) and what the
TRL wheels allocate (1.16 trl/kernels/chunked_logprob.py ChunkedLogProbFunction; 1.14.2 trl/trainer/sft_trainer.py
_chunked_cross_entropy_loss / _chunk), never perfguide's own output.
"""

from __future__ import annotations

import re

import pytest

try:  # tests/ as a plain folder or as a package
    from helpers import TINY_LLAMA, load_bench, one_line, tiny_model, tiny_spec, tiny_tokenizer
except ImportError:  # pragma: no cover
    from tests.helpers import TINY_LLAMA, load_bench, one_line, tiny_model, tiny_spec, tiny_tokenizer

import perfguide
from perfguide import Setup
from perfguide.errors import PerfGuideError
from perfguide.memory import fused_head
from perfguide.techniques import trl_trainer

V, H = 128, 32
GPU = "h100-80gb"
PURE_BF16 = dict(weights_dtype="bf16", autocast="bf16", micro_batch_size=2, seq_len=16)


def test_tiny_llama_dimensions():
    assert (TINY_LLAMA["vocab_size"], TINY_LLAMA["hidden_size"]) == (V, H) and not TINY_LLAMA.get("tie_word_embeddings", False)


@pytest.mark.parametrize("release, kind", [
    ("1.0.0", "full"), ("1.6.0", "full"),           # loss_type defaults to 'nll': the model's loss on full logits
    ("1.7.0", "chunked"), ("1.14.2", "chunked"),    # 'chunked_nll' the default (sft_config.py __post_init__)
    ("1.15.0", "fused"), ("1.16.0+local", "fused"),   # the fused LM head (add_fused_lm_head)
    (None, "fused"),                                 # no TRL here: what pip installs today
])
def test_era_by_trl_release(release, kind):
    assert fused_head.trl_era(release).sft_loss == kind


def test_fused_head_sft_loss_path_counted_by_hand():
    """Pure bf16, 2 rows of 16 tokens: 2 x 15 = 30 label positions through TRL 1.16's fused head."""
    pytest.importorskip("trl")
    n = 2 * 15
    saved = n * H * 2                    # the label positions' bf16 hidden states, saved for backward
    tile = n * 32768 * 2                 # mm_buf: [min(n, 4096), 32768] bf16, allocated 32768 wide whatever V is
    stats = n * 11 * 4                   # 7 online statistics + log_z, log_probs, entropy, is_top1 (as fp32)
    forward = tile + stats
    backward = n * H * 4 + tile + V * H * 4          # fp32 grad_hidden, the tile again, fp32 grad_weight of the head
    assert (saved, forward, backward) == (1_920, 1_967_400, 1_986_304)
    if fused_head.trl_era(fused_head.installed_trl()).sft_loss != "fused":
        pytest.skip("the installed TRL predates the fused head")
    trl = perfguide.estimate(tiny_spec(), Setup(trainer="trl", **PURE_BF16), hardware=GPU)
    hf = perfguide.estimate(tiny_spec(), Setup(**PURE_BF16), hardware=GPU)
    assert trl.logits == saved + backward
    # the tiny vocabulary's full logits are smaller than the 32768-wide buffer: priced as TRL allocates it
    assert hf.logits < trl.logits and any("SFTTrainer" in n and "fused LM head" in n for n in trl.notes)


@pytest.mark.parametrize("n, v", [(30, 128), (100, 1000)])
def test_fused_head_on_cpu_against_a_real_tensor_trace(n, v):
    """No Triton on a CPU: trl 1.16's ChunkedLogProbFunction run forward and backward on real fp32 CPU tensors under
    perfguide's live-bytes tracker; its peak (tile buffer, statistics, the torch fold's fp32 temporaries, the input
    gradient, plus the hidden states made before the trace) against the priced loss path. The head's fp32 gradient
    becomes its .grad, priced with the gradients, so it is taken off the trace."""
    pytest.importorskip("trl")
    import torch
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    from perfguide.memory.tracing.tracker import make_tracker

    if fused_head.trl_era(fused_head.installed_trl()).sft_loss != "fused":
        pytest.skip("the installed TRL predates the fused head")
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, H, generator=g, requires_grad=True)
    weight = torch.randn(v, H, generator=g, requires_grad=True)
    targets = torch.randint(0, v, (n,), generator=g)
    tracker = make_tracker(1)
    with tracker:
        log_probs, *_ = ChunkedLogProbFunction.apply(hidden, weight, None, targets, 1.0, 32768, None, 1.0,
                                                     ("log_probs", "entropy", "is_top1"))
        tracker.set_phase("backward")
        (-log_probs.sum()).backward()
    traced = max(peak for peak, _ in tracker.peaks.values()) - v * H * 4 + n * H * 4
    spec = tiny_spec().model_copy(update={"vocab_size": v})
    cpu = Setup(trainer="trl", device="cpu", weights_dtype="fp32", micro_batch_size=1, seq_len=n + 1)
    priced = trl_trainer.sft_loss_bytes(spec, cpu, cpu, 4)
    assert abs(priced - traced) / traced < 0.02, (priced, traced)
    gpu = cpu.replace(device="cuda")   # the Triton kernels write no tile-sized temporaries
    assert trl_trainer.sft_loss_bytes(spec, gpu, gpu, 4) < priced


@pytest.mark.parametrize("release, copy", [("1.14.2", 0), ("1.12.0", V * H * 4)])
def test_chunked_nll_loss_path_counted_by_hand(monkeypatch, release, copy):
    """TRL 1.7-1.14's chunked_nll on the same step: 30 positions, inside one 256-position chunk; through 1.12 each chunk
    projects through an fp32 copy of the head (h.float() @ w.float().t()) whose fp32 gradient backward computes."""
    monkeypatch.setattr(fused_head, "installed_trl", lambda: release)
    n = 30
    saved = n * H * 2                    # hidden[order]: the gathered label hidden states (bf16); its gradient alike
    chunk = 4 * n * V * 4                # fp32 logits, log_softmax, exp, exp * log_p (and their backward's four)
    projection = n * V * 4 + 2 * copy    # the logits' fp32 gradient, the fp32 head copy and its fp32 gradient
    setup = Setup(trainer="trl", **PURE_BF16)
    expected = 2 * saved + max(chunk + copy, projection)
    assert expected == {0: 65_280, V * H * 4: 81_664}[copy]
    assert trl_trainer.sft_loss_bytes(tiny_spec(), setup, setup, 2) == expected
    monkeypatch.setattr(fused_head, "installed_trl", lambda: "1.6.0")   # loss_type='nll': HF's full-logits path
    assert trl_trainer.sft_loss_bytes(tiny_spec(), setup, setup, 2) is None
    hf = Setup(**PURE_BF16)
    assert trl_trainer.sft_loss_bytes(tiny_spec(), hf, hf, 2) is None


@pytest.mark.parametrize("release, published_gb", [("1.13.0", 3.03), ("1.12.0", 5.99)])
def test_chunked_nll_against_the_v1_13_release_measurement(monkeypatch, release, published_gb):
    """TRL v1.13.0 release notes (https://github.com/huggingface/trl/releases/tag/v1.13.0): one chunk, 256 tokens x
    vocab 248,320 x hidden 2048, 1xH100, bf16, fwd+bwd: peak 5.99 GB before the fix (fp32 head copy), 3.03 GB after.
    The peak holds the bf16 head weight and its gradient beside the loss path."""
    monkeypatch.setattr(fused_head, "installed_trl", lambda: release)
    v, h = 248_320, 2048
    spec = tiny_spec().model_copy(update={"vocab_size": v, "hidden_size": h})
    setup = Setup(trainer="trl", weights_dtype="bf16", autocast="bf16", micro_batch_size=1, seq_len=257)
    peak = trl_trainer.sft_loss_bytes(spec, setup, setup, 2) + 2 * v * h * 2
    assert abs(peak / 1e9 - published_gb) / published_gb < 0.07, peak / 1e9


def test_dpo_implies_trl_and_refuses_the_transformers_trainer():
    assert Setup(objective="dpo").trainer == "trl" and Setup().trainer == "transformers"
    with pytest.raises(ValueError, match="trainer='trl'"):
        Setup(objective="dpo", trainer="transformers")
    with pytest.raises(PerfGuideError) as exc:
        perfguide.recommend(tiny_spec(), "train_gpu_one", hardware=GPU, seq_len=16, global_batch_size=4,
                            objective="dpo", trainer="transformers")
    one_line(exc, "trainer='trl'")
    with pytest.raises(PerfGuideError) as exc:
        perfguide.recommend(tiny_spec(), "train_gpu_one", hardware=GPU, seq_len=16, global_batch_size=4, trainer="keras")
    one_line(exc, "trainer")


def test_cli_flag_plans_for_trl(capsys):
    from perfguide.cli import main

    assert main(["recommend", "gpt2", "--hardware", GPU, "--seq-len", "1024", "--global-batch-size", "8", "--trainer", "trl", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"trainer": "trl"' in out and "SFTTrainer" in out


@pytest.mark.slow
def test_sft_trainer_runs_a_trl_plan(tmp_path):
    trl = pytest.importorskip("trl")
    import datasets
    import torch

    g = torch.Generator().manual_seed(0)
    data = datasets.Dataset.from_list([{"input_ids": torch.randint(3, V, (40,), generator=g).tolist()} for _ in range(16)])
    model = tiny_model()
    rec = perfguide.recommend(model, "train_cpu", seq_len=24, global_batch_size=4, precision="fp32", trainer="trl")
    assert rec.setup.trainer == "trl"
    args = rec.sft_config(output_dir=str(tmp_path / "out"), max_steps=2, report_to="none", save_strategy="no",
                          logging_strategy="no", disable_tqdm=True)
    assert isinstance(args, trl.SFTConfig) and args.loss_type == "nll" and args.max_length == 24
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tiny_tokenizer())
    assert tuple(next(iter(trainer.get_train_dataloader()))["input_ids"].shape) == (rec.setup.micro_batch_size, 24)
    trainer.train()
    assert trainer.state.global_step == 2


@pytest.mark.parametrize("method, expected", [
    ("TRL SFTTrainer (trl==1.15.0, loss_type='nll')", {"trainer": "trl"}),
    ("TRL SFTTrainer (trl==1.14.2, default loss_type: 'chunked_nll')", {"trainer": "trl"}),
    ("TRL SFTTrainer (trl==1.14.2, loss_type='nll')", {"trainer": "transformers"}),   # 1.7-1.14 'nll': full logits
    ("TRL DPOTrainer (trl==1.15.0)", {"objective": "dpo", "trainer": "trl"}),
    ("TRL DPOTrainer (trl==1.14.2)", {"objective": "dpo", "trainer": "trl"}),   # full logits: memory/dpo_logits.py
    ("TRL DPOTrainer (trl==0.19.1)", "0.x concatenated_forward"),
    ("TRL KTOTrainer (trl==1.15.0; batch size 2)", "KTOTrainer"),
    ("TRL SFTTrainer, no release named", {}),   # older rows keep HF Trainer's loss path
])
def test_bench_reads_a_rows_trl_trainer_and_release(method, expected):
    acc_trl = load_bench("accuracy_trl")
    skip = load_bench("accuracy_setup").Skip
    row = {"method": method}
    if isinstance(expected, str):
        with pytest.raises(skip, match=re.escape(expected)):
            acc_trl.trl_fields(row)
    else:
        assert acc_trl.trl_fields(row) == expected


def test_trl_step_runs_one_more_head_gemm():
    """The fused head's backward recomputes each tile: 2 V H FLOPs per position more than HF Trainer's step."""
    pytest.importorskip("trl")
    if fused_head.trl_era(fused_head.installed_trl()).sft_loss == "full":
        pytest.skip("the installed TRL builds full logits")
    common = dict(weights_dtype="bf16", autocast="bf16", micro_batch_size=2, seq_len=16)
    assert trl_trainer.trl_head_recompute_flops(tiny_spec(), Setup(trainer="trl", **common), 2 * 16) == 2 * V * H * 2 * 16
    assert trl_trainer.trl_head_recompute_flops(tiny_spec(), Setup(**common), 2 * 16) == 0
    big = dict(common, micro_batch_size=8, seq_len=1024)   # GPT-2: GEMM time, not launch overhead, sets the step
    trl = perfguide.estimate_speed("gpt2", Setup(trainer="trl", **big), hardware=GPU).compute_time_s
    hf = perfguide.estimate_speed("gpt2", Setup(**big), hardware=GPU).compute_time_s
    assert trl > hf


def test_dpo_plan_says_when_the_installed_trl_is_not_priced(monkeypatch):
    """TRL 0.x's DPOTrainer is not priced: the plan says so; 1.0-1.14 are priced on full logits, 1.15+ fused."""
    from perfguide.techniques import dpo

    monkeypatch.setattr(fused_head, "installed_trl", lambda: "0.19.1")
    assert "installed TRL 0.19.1 builds the full logits" in dpo.older_trl_warning()
    for release in ("1.14.2", "1.15.0"):
        monkeypatch.setattr(fused_head, "installed_trl", lambda release=release: release)
        assert dpo.older_trl_warning() == ""


def test_a_trl_plans_script_lines_run_sft_trainer():
    rec = perfguide.recommend(tiny_spec(), "train_gpu_one", hardware=GPU, seq_len=16, global_batch_size=4, trainer="trl")
    text = rec.report()
    assert 'args = rec.sft_config(output_dir="out")' in text and "SFTTrainer(model=model, args=args" in text
    assert "rec.training_args(" not in text


def test_hf_training_args_for_a_trl_plan_warn():
    pytest.importorskip("transformers")
    rec = perfguide.recommend(tiny_model(), "train_cpu", seq_len=16, global_batch_size=4, precision="fp32", trainer="trl")
    with pytest.warns(UserWarning, match="priced for TRL's SFTTrainer"):
        rec.training_args(output_dir="out", report_to="none")


def test_trainer_is_refused_by_an_inference_scenario():
    with pytest.raises(PerfGuideError) as exc:
        perfguide.recommend(tiny_spec(), "infer_gpu_one", hardware=GPU, trainer="trl")
    one_line(exc, "trainer")
