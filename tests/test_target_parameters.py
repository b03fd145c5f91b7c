"""peft's ``target_parameters`` (``LoraSpec.target_parameters``): a transformers-5 MoE's fused expert stacks adapted
as parameters at rank r, all layers or one layer by index, checked against real peft models on CPU; read from axolotl's
``lora_target_parameters`` and TRL's ModelConfig, and written into the LoraConfig."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import moe_config

import perfguide
from perfguide.errors import InvalidSetupError
from perfguide.memory.ledger import ledger
from perfguide.model.types import ModelSpec
from perfguide.setup import LoraSpec, Setup

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

H, W, E, R = 80, 56, 5, 4
STACKS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def _tiny_moe(h: int = H, w: int = W, e: int = E) -> object:
    import torch

    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(**moe_config("qwen3_moe", h, w, e, 2))
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _trainable(targets: tuple[str, ...], parameters: tuple[str, ...]) -> tuple[int, int]:
    """(what peft trains, what perfguide's ledger prices) for one LoraConfig on the tiny Qwen3-MoE."""
    model = _tiny_moe()
    spec = ModelSpec.from_any(model)
    config = peft.LoraConfig(r=R, lora_alpha=8, lora_dropout=0.0, target_modules=list(targets), target_parameters=list(parameters))
    adapted = peft.get_peft_model(model, config)
    real = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    lora = LoraSpec(r=R, alpha=8, target_modules=targets, target_parameters=parameters)
    return real, ledger(spec, Setup(micro_batch_size=1, seq_len=32, weights_dtype="fp32", lora=lora)).trainable_params


def test_expert_stacks_train_at_rank_r_as_peft_builds_them() -> None:
    """Named as parameters, gate_up trains at r (peft's conversion of gate_proj + up_proj doubles it; this does not):
    per layer and expert r x (h + 2w) + r x (w + h), beside the attention's adapters."""
    real, priced = _trainable(("q_proj",), STACKS)
    assert priced == real
    q_proj = 2 * R * (H + 5 * 16)
    assert real == q_proj + 2 * E * R * ((H + 2 * W) + (W + H))


def test_a_layer_index_adapts_that_layer_only() -> None:
    real, priced = _trainable(("q_proj",), ("1.mlp.experts.down_proj",))
    assert priced == real == 2 * R * (H + 5 * 16) + E * R * (W + H)


def test_names_reaching_no_stack_are_refused() -> None:
    lora = LoraSpec(r=8, target_modules=("q_proj",), target_parameters=("mlp.experts.gate_up_proj",))
    with pytest.raises(InvalidSetupError, match="reaches no fused expert stack"):
        perfguide.estimate("meta-llama/Llama-3.1-8B", Setup(micro_batch_size=1, seq_len=512, lora=lora))
    with pytest.raises(InvalidSetupError, match="reaches no fused expert stack"):
        ledger(ModelSpec.from_any("Qwen/Qwen3-30B-A3B"),
               Setup(micro_batch_size=1, seq_len=512, lora=lora.model_copy(update={"target_parameters": ("99.mlp.experts.down_proj",)})))


def _read_lora(path: Path) -> dict[str, object]:
    from perfguide.integrations.readers import read_file

    settings = {s.field: s.value for s in read_file(str(path)).settings}
    lora = settings["lora"]
    assert isinstance(lora, dict)
    return lora


def test_lora_config_carries_them(tmp_path: Path) -> None:
    """axolotl's lora_target_parameters read by check, and the plan's LoraConfig as peft builds it."""
    path = tmp_path / "moe.yml"
    path.write_text("base_model: Qwen/Qwen3-30B-A3B\nadapter: lora\nlora_r: 8\nlora_alpha: 16\nlora_target_modules: [q_proj, v_proj]\n"
                    "lora_target_parameters:\n  - mlp.experts.gate_up_proj\n  - mlp.experts.down_proj\n"
                    "micro_batch_size: 1\nsequence_len: 1024\nbf16: true\ngradient_checkpointing: true\n")
    lora = _read_lora(path)
    assert lora["target_parameters"] == STACKS
    rec = perfguide.recommend("Qwen/Qwen3-30B-A3B", "train_gpu_one", hardware="h100-80gb", finetune="lora", lora=lora)
    assert rec.setup.lora is not None and rec.setup.lora.target_parameters == STACKS
    config = rec.lora_config()
    assert set(config.target_parameters) == set(STACKS)


def test_trl_model_config_reads_them(tmp_path: Path) -> None:
    from trl import ModelConfig, get_peft_config

    path = tmp_path / "sft.yaml"
    path.write_text("model_name_or_path: Qwen/Qwen3-30B-A3B\nuse_peft: true\nlora_r: 8\nlora_target_modules: [q_proj]\n"
                    "lora_target_parameters: [mlp.experts.down_proj]\nper_device_train_batch_size: 1\nmax_length: 1024\n")
    lora = _read_lora(path)
    assert lora["target_parameters"] == ("mlp.experts.down_proj",)
    trl_config = get_peft_config(ModelConfig(use_peft=True, lora_target_modules=["q_proj"], lora_target_parameters=["mlp.experts.down_proj"]))
    assert list(trl_config.target_parameters) == list(lora["target_parameters"])


def test_check_says_where_peft_turns_listed_names_into_expert_stacks(tmp_path: Path) -> None:
    """axolotl's Qwen3-Next QLoRA example lists shared_expert.up_proj / down_proj / gate_proj: peft 0.19 and later match
    them as the v4 expert names (a name ending in '.down_proj') and adapt the 512 routed experts' stacks instead."""
    path = tmp_path / "next.yml"
    path.write_text("base_model: Qwen/Qwen3-Next-80B-A3B-Thinking\nload_in_4bit: true\nadapter: qlora\nlora_r: 16\nlora_alpha: 8\n"
                    "lora_target_modules: [q_proj, shared_expert.up_proj, shared_expert.down_proj, shared_expert.gate_proj]\n"
                    "micro_batch_size: 1\nsequence_len: 1024\nbf16: true\ngradient_checkpointing: true\n")
    result = perfguide.check(config=str(path), hardware="h200-141gb")
    note = next(n for n in result.notes if "peft 0.19 and later" in n)
    assert "shared_expert.down_proj" in note and "experts.gate_up_proj" in note and "q_proj," not in note


def test_the_recomputed_adapted_block_holds_its_whole_merged_stacks() -> None:
    """One layer of two adapted by index: the block an adapted layer's recompute saves for backward is that layer's
    merged gate_up and down stacks (bf16), the fp32 adapters' bf16 copies baddbmm keeps, and per token the gathered
    copy and the down input (traced with saved_tensors_hooks on real peft modules); perfguide's average over the
    layers plus the recomputed block's excess is that block."""
    import torch
    from helpers import saved_in_block

    from perfguide.memory import activations as act
    from perfguide.memory.moe_lora import expert_lora_block_excess, expert_lora_bytes

    def saved(parameters: tuple[str, ...]) -> int:
        model = _tiny_moe().to(torch.bfloat16)
        config = peft.LoraConfig(r=R, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj"], target_parameters=list(parameters))
        adapted = peft.get_peft_model(model, config).train()
        ids = torch.randint(0, 384, (1, 24))
        return int(saved_in_block(adapted, adapted.get_base_model().model.layers[1], ids))

    stacks = ("1.mlp.experts.gate_up_proj", "1.mlp.experts.down_proj")
    traced = saved(stacks) - saved(())
    by_hand = 2 * E * (H * 2 * W + W * H) + 2 * E * R * ((H + 2 * W) + (W + H)) + 24 * 2 * 2 * (H + W)
    assert traced == by_hand
    spec = ModelSpec.from_any(_tiny_moe())
    setup = Setup(micro_batch_size=1, seq_len=24, weights_dtype="bf16", lora=LoraSpec(r=R, alpha=8, target_modules=("q_proj",),
                                                                                        target_parameters=stacks))
    led = ledger(spec, setup)
    args = (spec, setup, led.experts, led.param_bytes, True, act.regime(setup))
    assert expert_lora_bytes(*args) * 2 == traced                         # the average over the two layers
    assert expert_lora_bytes(*args) + expert_lora_block_excess(*args) == traced


#: stacks wide against the 4 tokens' tensors, so that what those free before the gradient's moment stays under 1%
BIG = {"h": 128, "w": 256, "e": 16}


def _backward_rise(parameters: tuple[str, ...]) -> int:
    """How far layer 1's MoE block's backward rises above what its forward left alive (real peft modules, bf16)."""
    import torch
    from helpers import live_storages

    model = _tiny_moe(**BIG).to(torch.bfloat16)
    config = peft.LoraConfig(r=R, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj"], target_parameters=list(parameters))
    adapted = peft.get_peft_model(model, config).train()
    block = adapted.get_base_model().model.layers[1].mlp
    x = torch.randn(1, 4, BIG["h"], dtype=torch.bfloat16, requires_grad=True)
    live = live_storages(*adapted.parameters(), x)
    with live:
        out = block(x)
        out = out[0] if isinstance(out, tuple) else out
        live.peak = forward_end = live.live
        out.float().pow(2).sum().backward()
    return int(live.peak - forward_end)


@pytest.mark.parametrize("stacks", [("1.mlp.experts.gate_up_proj", "1.mlp.experts.down_proj"),
                                    ("1.mlp.experts.gate_up_proj",), ("1.mlp.experts.down_proj",)])
def test_the_merged_stacks_gradient_rises_above_what_the_block_saved(stacks: tuple[str, ...]) -> None:
    """grouped_mm's backward makes each merged stack's whole gradient: down's first, beside both saved stacks (+D),
    then gate_up's once down's stack is freed (+G - D), or G / D where one is adapted alone. Traced on real peft
    modules (the rise of the backward above the forward's end, less the unadapted block's), against the hand count
    and against what the ledger prices in the adapted layer's backward."""
    from perfguide.memory import activations as act
    from perfguide.memory.moe_lora import merged_stack_grad_bytes

    h, w, e = BIG["h"], BIG["w"], BIG["e"]
    gate_up, down = 2 * e * h * 2 * w, 2 * e * w * h                  # bf16 stacks, bytes
    named = {s.rsplit(".", 1)[-1] for s in stacks}
    by_hand = max(down, gate_up - down) if len(named) == 2 else gate_up if "gate_up_proj" in named else down
    traced = _backward_rise(stacks) - _backward_rise(())
    assert abs(traced - by_hand) <= 0.01 * by_hand, (traced, by_hand)
    setup = Setup(micro_batch_size=1, seq_len=4, weights_dtype="bf16", lora=LoraSpec(r=R, alpha=8, target_modules=("q_proj",),
                                                                                       target_parameters=stacks))
    assert merged_stack_grad_bytes(ledger(ModelSpec.from_any(_tiny_moe(**BIG)), setup).experts, act.regime(setup)) == by_hand


def test_gpt_oss_router_is_its_mlp_router() -> None:
    """gpt-oss's router is ``mlp.router`` (GptOssTopKRouter), not Qwen's ``mlp.gate``: peft adapts
    ``mlp.router.weight`` at rank r (r x (hidden + experts) per layer), and perfguide prices that, where it had refused
    the name."""
    import torch

    config = transformers.GptOssConfig(hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=1, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                       vocab_size=256, layer_types=["sliding_attention", "full_attention"])
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    spec = ModelSpec.from_any(model)
    adapted = peft.get_peft_model(model, peft.LoraConfig(r=R, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj"],
                                                         target_parameters=["mlp.router.weight"]))
    real = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    assert real == 2 * (R * (64 + 64) + R * (64 + 4))
    lora = LoraSpec(r=R, alpha=8, target_modules=("q_proj",), target_parameters=("mlp.router.weight",))
    assert ledger(spec, Setup(micro_batch_size=1, seq_len=8, weights_dtype="fp32", lora=lora)).trainable_params == real
