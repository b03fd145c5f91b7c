"""DPO (objective='dpo'): the reference model's bytes, the fused head's buffers and the step's FLOPs counted by hand
on the tiny Llama, the one-line refusals, and ``rec.dpo_config()`` running a real TRL DPOTrainer on CPU.

Hand counts use the tiny Llama's dimensions (tests/helpers.py TINY_LLAMA: V 128, H 32, FFN 64, 2 layers, 4 heads of 8,
2 KV heads, untied head) and what trl 1.16 allocates (trainer/dpo_trainer.py, kernels/chunked_logprob.py), never
perfguide's own output.
"""

from __future__ import annotations

import pytest

try:  # tests/ as a plain folder or as a package
    from helpers import TINY_LLAMA, one_line, tiny_model, tiny_spec, tiny_tokenizer
except ImportError:  # pragma: no cover
    from tests.helpers import TINY_LLAMA, one_line, tiny_model, tiny_spec, tiny_tokenizer

import perfguide
from perfguide import Setup
from perfguide.errors import PerfGuideError
from perfguide.techniques.dpo import extra_head_flops

V, H, FFN, L = 128, 32, 64, 2
Q_OUT, KV_OUT = 4 * 8, 2 * 8
PER_LAYER = H * Q_OUT + 2 * H * KV_OUT + Q_OUT * H + 3 * H * FFN + 2 * H   # q, k, v, o, gate/up/down, two norms
PARAMS = V * H + L * PER_LAYER + H + V * H                                  # embedding, blocks, final norm, head
GPU = "h100-80gb:4"


def test_hand_count_of_the_tiny_llama_matches_its_spec():
    assert TINY_LLAMA["hidden_size"] == H and TINY_LLAMA["vocab_size"] == V
    assert tiny_spec().total_params == PARAMS == 26_784


def _mem(**fields):
    return perfguide.estimate(tiny_spec(), Setup(**fields), hardware=GPU)


@pytest.mark.parametrize("fields, per_gpu", [
    (dict(weights_dtype="bf16", autocast="bf16"), 2 * PARAMS),                 # one GPU: a whole copy in the load dtype
    (dict(weights_dtype="fp32", autocast="bf16"), 4 * PARAMS),                 # AMP loads fp32: so does the reference
    (dict(weights_dtype="fp32", autocast="bf16", strategy="zero2", num_gpus=4), 2 * PARAMS),   # ZeRO stage 0, cast to bf16
    (dict(weights_dtype="fp32", autocast="bf16", strategy="zero3", num_gpus=4), 2 * PARAMS // 4),   # partitioned
    (dict(weights_dtype="fp32", autocast="bf16", strategy="fsdp", num_gpus=4), 4 * PARAMS // 4),    # fp32 shards
    (dict(weights_dtype="bf16", autocast="bf16", lora={"r": 4}), 0),            # adapters disabled: no copy
    (dict(weights_dtype="bf16", autocast="bf16", precompute_ref_log_probs=True), 0),
])
def test_reference_model_bytes_per_gpu(fields, per_gpu):
    dpo, sft = _mem(objective="dpo", **fields), _mem(**{k: v for k, v in fields.items() if k != "precompute_ref_log_probs"})
    assert dpo.weights - sft.weights == per_gpu


def test_fused_head_loss_path_counted_by_hand():
    """Pure bf16, 2 pairs of 16 tokens: 2 x 2 x 15 = 60 label positions through TRL's chunked log-prob head."""
    n = 2 * 2 * 15
    saved = n * H * 2                    # the label positions' hidden states, saved for backward
    tile = n * 32768 * 2                 # mm_buf: [min(n, 4096), 32768] bf16, allocated 32768 wide whatever V is
    stats = n * 12 * 4                   # the online-logsumexp statistics and outputs, fp32
    forward = tile + stats
    backward = n * H * 4 + tile + V * H * 4          # fp32 input grad, the tile again, the head's fp32 weight grad
    tokens = 2 * 2 * 16                              # the reference forward: one layer at a time over 4 rows
    layer = 2 * tokens * H * 2 + 3 * tokens * FFN * 2   # residual + gated MLP (its attention buffers are smaller)
    head = tokens * H * 2 + saved + tile + stats
    reference = max(layer, head)
    assert (forward, reference, backward) == (3_935_040, 3_942_976, 3_956_224)
    assert _mem(objective="dpo", weights_dtype="bf16", autocast="bf16", micro_batch_size=2, seq_len=16).logits == saved + backward


def test_policy_activations_are_two_rows_per_pair():
    dpo = _mem(objective="dpo", weights_dtype="bf16", autocast="bf16", micro_batch_size=2, seq_len=16)
    sft = _mem(weights_dtype="bf16", autocast="bf16", micro_batch_size=4, seq_len=16)
    assert dpo.activations == sft.activations
    # AMP: HF's head matmul saves a bf16 copy of the fp32 head for backward; TRL's fused head saves the fp32 weight
    amp_dpo = _mem(objective="dpo", weights_dtype="fp32", autocast="bf16", micro_batch_size=2, seq_len=16)
    amp_sft = _mem(weights_dtype="fp32", autocast="bf16", micro_batch_size=4, seq_len=16)
    assert amp_sft.activations - amp_dpo.activations == 2 * V * H


def _flops(**fields):
    return perfguide.estimate_speed(tiny_spec(), Setup(**fields), hardware=GPU).flops_per_step


def test_step_flops_counted_by_hand():
    """One pair of 16 tokens: 32 rows through the policy (6 N per token), 32 through the reference's blocks (2 N')."""
    tokens, s = 32, 16
    n_matmul = PARAMS - V * H                  # every parameter but the embedding lookup (perfguide's 2N convention)
    n_blocks = n_matmul - V * H                # the reference forward's blocks; its head is priced apart
    attn_fwd = 4 * L * Q_OUT * s * s * 2       # QK^T and AV of the two rows
    policy = 6 * n_matmul * tokens + 3 * attn_fwd
    reference = 2 * n_blocks * tokens + attn_fwd
    common = dict(weights_dtype="bf16", autocast="bf16", micro_batch_size=1, seq_len=s)
    assert _flops(objective="dpo", **common) == policy + reference
    assert _flops(objective="dpo", precompute_ref_log_probs=True, **common) == policy
    # the two head GEMMs an SFT step does not run: the backward's tile recompute and the reference's head
    assert extra_head_flops(tiny_spec(), Setup(objective="dpo", **common)) == 2 * (2 * V * H * 2 * 15)


def test_sharded_reference_gathers_its_weights_every_micro_step():
    """ZeRO-3 on 4 GPUs: the reference's bf16 weights cross one ring all-gather per micro-step, (n-1)/n of them."""
    from perfguide import Hardware
    from perfguide._data import fact_value

    hw = Hardware.from_name(GPU)
    bus = float(fact_value("efficiency", "comm_bus_fraction"))
    common = dict(weights_dtype="fp32", autocast="bf16", strategy="zero3", num_gpus=4, micro_batch_size=1, seq_len=16,
                  gradient_accumulation_steps=3)

    def comm(**fields):
        return perfguide.estimate_speed(tiny_spec(), Setup(**common, **fields), hardware=GPU).comm_total_s

    gather = 3 / 4 * PARAMS * 2 / (hw.intra_node_bandwidth_gbps * 1e9 * bus)
    assert comm(objective="dpo") - comm(objective="dpo", precompute_ref_log_probs=True) == pytest.approx(3 * gather, rel=1e-9)
    assert comm(objective="dpo", lora={"r": 4}) == comm(lora={"r": 4})   # LoRA: the reference is the policy itself


@pytest.mark.parametrize("scenario, hw", [("train_gpu_one", "a100-40gb"), ("train_gpu_many", "a100-40gb:2")])
def test_a_dpo_plan_that_does_not_fit_offers_the_precomputed_reference(scenario, hw):
    """8B full DPO on 40 GB A100s: the policy's states and the reference copy do not fit; without the copy they do."""
    ask = dict(scenario=scenario, hardware=hw, seq_len=1024, global_batch_size=16, objective="dpo", allow_offload=False)
    rec = perfguide.recommend("meta-llama/Llama-3.1-8B", **ask)
    assert not rec.fits and rec.suggestions[0].startswith("precompute_ref_log_probs=True fits")
    precomputed = perfguide.recommend("meta-llama/Llama-3.1-8B", precompute_ref_log_probs=True, **ask)
    assert precomputed.fits and f"({precomputed.setup.label})" in rec.suggestions[0]


def test_bad_objective_and_dpo_only_settings_are_one_line_errors():
    with pytest.raises(PerfGuideError) as exc:
        perfguide.recommend(tiny_spec(), "train_gpu_one", hardware=GPU, seq_len=16, global_batch_size=4, objective="ppo")
    assert "objective" in one_line(exc) and "'sft' or 'dpo'" in one_line(exc)
    with pytest.raises(PerfGuideError, match="precompute_ref_log_probs is a DPO setting"):
        perfguide.recommend(tiny_spec(), "train_gpu_one", hardware=GPU, seq_len=16, global_batch_size=4, precompute_ref_log_probs=True)
    for model in ("google/flan-t5-large", "bert-base-uncased"):   # DPOTrainer patches a causal LM's head
        with pytest.raises(PerfGuideError, match="decoder-only causal LM") as exc:
            perfguide.recommend(model, "train_gpu_one", hardware=GPU, seq_len=16, global_batch_size=4, objective="dpo")
        assert "\n" not in str(exc.value)
    for fields, said in ((dict(padding_free=True), "padding_free"), (dict(liger_kernel=True), "Liger"),
                         (dict(task="infer"), "train")):
        with pytest.raises(ValueError, match=said):
            Setup(objective="dpo", **fields)


def test_cli_flag_plans_dpo(capsys):
    from perfguide.cli import main

    assert main(["recommend", "gpt2", "--hardware", GPU, "--seq-len", "512", "--global-batch-size", "8", "--objective", "dpo", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"objective": "dpo"' in out and "DPO reference: a frozen copy" in out
    # the headline's script lines run TRL's DPOTrainer with the plan's DPOConfig, not a plain Trainer
    assert main(["recommend", "gpt2", "--hardware", GPU, "--seq-len", "512", "--global-batch-size", "8", "--objective", "dpo"]) == 0
    out = capsys.readouterr().out
    assert 'args = rec.dpo_config(output_dir="out")' in out and "DPOTrainer(model=model, args=args" in out
    assert "rec.training_args(" not in out


def test_sft_and_dpo_configs_refuse_the_other_objective():
    spec = tiny_spec()
    dpo = perfguide.recommend(spec, "train_gpu_one", hardware=GPU, seq_len=16, global_batch_size=4, objective="dpo")
    sft = perfguide.recommend(spec, "train_gpu_one", hardware=GPU, seq_len=16, global_batch_size=4)
    with pytest.raises(PerfGuideError, match="dpo_config"):
        dpo.sft_config_dict()
    with pytest.raises(PerfGuideError, match="objective='dpo'"):
        sft.dpo_config_dict()
    batch = dpo.decision("per_device_train_batch_size")
    assert batch.number == 2 * dpo.setup.micro_batch_size * 16 and "preference pairs" in batch.reason
    kw = dpo.dpo_config_dict()
    assert kw["per_device_train_batch_size"] == dpo.setup.micro_batch_size and kw["max_length"] == 16
    assert kw["precompute_ref_log_probs"] is False and "packing" not in kw


def test_check_reads_a_dpo_config_as_the_dpo_step(tmp_path):
    """perfguide.check on a real trl.DPOConfig: TRL's defaults (checkpointing, bf16, max_length 1024), the pairs per
    device and the reference setting it says, priced as the DPO step it runs."""
    import dataclasses
    import warnings

    trl = pytest.importorskip("trl")
    import transformers

    from perfguide.integrations.readers import hf_keys

    def names(cls: type) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    assert set(hf_keys.DPO_CONFIG) == names(trl.DPOConfig) - names(transformers.TrainingArguments) - set(hf_keys.SFT_CONFIG)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        cfg = trl.DPOConfig(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=2, precompute_ref_log_probs=True)
    c = perfguide.check("gpt2", cfg, hardware="a100-80gb", device="cuda")
    s = c.setup
    assert (s.objective, s.precompute_ref_log_probs, s.micro_batch_size) == ("dpo", True, 2)
    assert s.seq_len == cfg.max_length == 1024 and s.gradient_checkpointing is cfg.activation_checkpointing is True
    assert c.memory == perfguide.estimate("gpt2", s, hardware="a100-80gb")
    # a YAML / dict of DPOConfig kwargs: any DPO-only key marks the run
    assert perfguide.check("gpt2", {"beta": 0.1, "per_device_train_batch_size": 4}, hardware="a100-80gb", device="cuda").setup.objective == "dpo"
    assert perfguide.check("gpt2", {"per_device_train_batch_size": 4}, hardware="a100-80gb", device="cuda").setup.objective == "sft"


# --- a real DPOTrainer on CPU --------------------------------------------------------------------------------

QUIET = dict(report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True)


def _pairs(n: int = 8):
    import datasets
    import torch

    g = torch.Generator().manual_seed(0)

    def words(k: int) -> str:
        return " ".join(f"t{int(i)}" for i in torch.randint(3, V, (k,), generator=g))

    # completions longer than the plan's seq_len: truncation to max_length is observable
    return datasets.Dataset.from_list([{"prompt": words(8) + " ", "chosen": words(30), "rejected": words(20)} for _ in range(n)])


def _saved_tiny(tmp_path):
    """DPOTrainer loads the reference from the policy's config._name_or_path, so the policy comes from a folder."""
    from transformers import AutoModelForCausalLM

    tiny_model().save_pretrained(tmp_path / "tiny")
    return AutoModelForCausalLM.from_pretrained(tmp_path / "tiny")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["full", "lora", "precomputed"])
def test_dpo_trainer_runs_the_plan(tmp_path, mode):
    pytest.importorskip("trl")
    import torch
    import trl

    model = _saved_tiny(tmp_path)
    extra = {"full": {}, "lora": dict(finetune="lora", lora={"r": 4, "alpha": 8}), "precomputed": dict(precompute_ref_log_probs=True)}[mode]
    rec = perfguide.recommend(model, "train_cpu", seq_len=24, global_batch_size=4, precision="fp32", gradient_checkpointing=True,
                              objective="dpo", **extra)
    s = rec.setup
    args = rec.dpo_config(output_dir=str(tmp_path / "out"), max_steps=2, **QUIET)
    assert isinstance(args, trl.DPOConfig)
    assert args.per_device_train_batch_size == s.micro_batch_size and args.gradient_accumulation_steps == s.gradient_accumulation_steps
    assert args.max_length == s.seq_len and args.gradient_checkpointing is True and args.use_cpu is True
    assert args.precompute_ref_log_probs is (mode == "precomputed") and args.bf16 is False and args.fp16 is False
    if mode == "lora":   # as the report's script lines do it: the plan's adapter put on by prepare_model
        model = rec.prepare_model(model)
    trainer = trl.DPOTrainer(model=model, args=args, train_dataset=_pairs(), processing_class=tiny_tokenizer())
    batch = next(iter(trainer.get_train_dataloader()))
    # chosen and rejected of every pair in one forward, cut at the planned length: what the plan priced
    assert tuple(batch["input_ids"].shape) == (2 * s.micro_batch_size, s.seq_len)
    if mode == "full":   # a second copy in the policy's dtype, run under no_grad
        assert trainer.ref_model is not None and trainer.ref_model is not trainer.model
        assert {p.dtype for p in trainer.ref_model.parameters()} == {torch.float32}
        assert sum(p.numel() for p in trainer.ref_model.parameters()) == PARAMS
    else:                # LoRA disables its adapters; a precomputed reference is dropped
        assert trainer.ref_model is None
    if mode == "precomputed":
        assert "ref_chosen_logps" in trainer.train_dataset.column_names
    trainer.train()
    assert trainer.state.global_step == 2
