"""Which stack gives embeddings 32-bit bitsandbytes state (``Setup.bnb_embedding_override``).

The HF Trainer registers bnb's GlobalOptimManager override (optim_bits=32 for every nn.Embedding weight) when it builds
an 8-bit bnb optimizer from ``optim`` (Trainer.create_optimizer); torchtune instantiates bnb's class itself and
registers none, so there every tensor of >= 4096 elements (Optimizer8bit ``min_8bit_size``) has 8-bit state. The
states are measured on real CPU tensors with bitsandbytes (it runs on CPU since 0.50) and counted by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from perfguide import ModelSpec, Setup
from perfguide.errors import InvalidSetupError
from perfguide.memory.optimizers import TensorGroup, optimizer_cost

V, H = 128_256, 4096      # Llama-3.1-8B's vocabulary and hidden size (config.json)


def q8(n: int) -> int:
    """Two uint8 moments plus one fp32 absmax per 2048-element block each (bnb blockwise 8-bit)."""
    return 2 * (n + -(-n // 2048) * 4)


def test_embedding_state_is_8bit_without_the_override() -> None:
    groups = [TensorGroup(1, V, H, "embedding"), TensorGroup(1, V, H, "head"), TensorGroup(3, 1024, 1, "other")]
    small = 3 * 8 * 1024          # 1,024-element vectors are under min_8bit_size: two fp32 moments either way
    with_override = optimizer_cost("paged_adamw_8bit", groups, 2).states
    without = optimizer_cost("paged_adamw_8bit", groups, 2, embedding_32bit=False).states
    assert with_override == 8 * V * H + q8(V * H) + small
    assert without == 2 * q8(V * H) + small
    # torchtune's Llama-3.1-8B: 2.93 GiB less state than the Trainer's layout
    assert 2.9 < (with_override - without) / 2**30 < 3.0


def test_other_optimizers_ignore_the_flag() -> None:
    groups = [TensorGroup(1, 1000, 64, "embedding"), TensorGroup(4, 64, 64)]
    for name in ("adamw_torch_fused", "paged_adamw_32bit", "adamw_torch_8bit"):
        assert optimizer_cost(name, groups, 4).states == optimizer_cost(name, groups, 4, embedding_32bit=False).states, name


@pytest.mark.parametrize("override", [True, False])
def test_bitsandbytes_itself_keeps_embeddings_8bit_unless_overridden(override: bool) -> None:
    torch = pytest.importorskip("torch")
    bnb = pytest.importorskip("bitsandbytes")
    manager = bnb.optim.GlobalOptimManager.get_instance()
    manager.initialize()   # overrides other tests registered are keyed by id(); a reused id would leak into this one
    emb, lin = torch.nn.Embedding(1024, 64), torch.nn.Linear(64, 64, bias=False)   # 65,536 and 4,096 elements
    if override:
        manager.register_module_override(emb, "weight", {"optim_bits": 32})
    opt = bnb.optim.PagedAdamW8bit([emb.weight, lin.weight], lr=1e-3)
    lin(emb(torch.randint(0, 1024, (2, 8)))).sum().backward()
    opt.step()
    measured = sum(v.numel() * v.element_size() for p in (emb.weight, lin.weight) for k, v in opt.state[p].items()
                   if torch.is_tensor(v) and v.numel() > 1 and not k.startswith("qmap"))
    groups = [TensorGroup(1, 1024, 64, "embedding"), TensorGroup(1, 64, 64)]
    # within 2%: bnb 0.50 keeps one absmax per 256 elements where the 2024 releases perfguide prices kept one per 2048
    assert measured == pytest.approx(optimizer_cost("paged_adamw_8bit", groups, 4, embedding_32bit=override).states, rel=0.02)
    if not override:   # the 32-bit reading would be ~4x the measured state
        assert measured < 0.5 * optimizer_cost("paged_adamw_8bit", groups, 4).states
    assert opt.state[emb.weight]["state1"].dtype == (torch.float32 if override else torch.uint8)
    manager.initialize()


def test_setup_flag_reaches_the_memory_estimate() -> None:
    from perfguide import Hardware
    from perfguide.memory import estimate_memory

    spec = ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    base = dict(weights_dtype="bf16", optimizer="adamw_bnb_8bit", seq_len=256, gradient_checkpointing=True)
    hw = Hardware.from_name("a100-80gb")
    trainer = estimate_memory(spec, Setup(**base), hw).optimizer_states
    torchtune = estimate_memory(spec, Setup(**base, bnb_embedding_override=False), hw).optimizer_states
    assert trainer - torchtune == 8 * V * H - q8(V * H)


def test_torchtune_config_reads_without_the_override_and_the_trainer_refuses_it(tmp_path: Path) -> None:
    import perfguide

    cfg = tmp_path / "8B_full_single_device.yaml"    # the keys of torchtune's recipes/configs/llama3_1/8B_full_single_device.yaml
    cfg.write_text(yaml.safe_dump({"model": {"_component_": "torchtune.models.llama3_1.llama3_1_8b"}, "batch_size": 2,
                                   "optimizer": {"_component_": "bitsandbytes.optim.PagedAdamW8bit", "lr": 2e-5},
                                   "optimizer_in_bwd": True, "enable_activation_checkpointing": True, "dtype": "bf16"}))
    c = perfguide.check(None, cfg, hardware="rtx4090", seq_len=2048)
    assert c.setup.optimizer == "paged_adamw_8bit" and c.setup.bnb_embedding_override is False

    from perfguide.techniques.base import EmitContext
    from perfguide.techniques.optimizers import Optimizer

    with pytest.raises(InvalidSetupError, match="bnb_embedding_override"):
        Optimizer().training_args(EmitContext(setup=c.setup))
    assert Optimizer().training_args(EmitContext(setup=c.setup.model_copy(update={"bnb_embedding_override": True}))) == {"optim": "paged_adamw_8bit"}


def test_trainer_gives_a_saved_embedding_copy_32bit_state_and_the_head_copy_8bit(tmp_path: Path) -> None:
    """PEFT's modules_to_save copies keep their original's class, so Trainer.create_optimizer registers the 32-bit
    override for the embedding's copy (an nn.Embedding) and not for the head's (an nn.Linear): measured with the
    real Trainer, PEFT and bitsandbytes on CPU, and priced by the ledger's saved-module groups."""
    torch = pytest.importorskip("torch")
    bnb = pytest.importorskip("bitsandbytes")
    peft = pytest.importorskip("peft")
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    from perfguide.memory.ledger import saved_module_groups

    bnb.optim.GlobalOptimManager.get_instance().initialize()
    vocab, hidden = 1024, 64
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=4, tie_word_embeddings=False)
    model = peft.get_peft_model(LlamaForCausalLM(cfg), peft.LoraConfig(r=4, target_modules=["q_proj"],
                                                                       modules_to_save=["embed_tokens", "lm_head"]))
    args = TrainingArguments(output_dir=str(tmp_path), optim="adamw_bnb_8bit", use_cpu=True, report_to=[])
    opt = Trainer(model=model, args=args).create_optimizer()
    ids = torch.randint(0, vocab, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    inner = getattr(opt, "optimizer", opt)
    copies = {n.split(".modules_to_save")[0].rsplit(".", 1)[-1]: p for n, p in model.named_parameters() if ".modules_to_save." in n}
    assert inner.state[copies["embed_tokens"]]["state1"].dtype == torch.float32
    assert inner.state[copies["lm_head"]]["state1"].dtype == torch.uint8
    measured = sum(v.numel() * v.element_size() for p in copies.values() for k, v in inner.state[p].items()
                   if torch.is_tensor(v) and v.numel() > 1 and not k.startswith("qmap"))
    spec = ModelSpec.from_any("meta-llama/Llama-3.2-1B").model_copy(update={"vocab_size": vocab, "hidden_size": hidden})
    setup = Setup(lora={"r": 4, "modules_to_save": ("embed_tokens", "lm_head")}, optimizer="adamw_bnb_8bit")
    priced = optimizer_cost("adamw_bnb_8bit", list(saved_module_groups(spec, setup)), 4).states
    assert priced == 8 * vocab * hidden + q8(vocab * hidden)
    assert measured == pytest.approx(priced, rel=0.02)   # bnb 0.50: one absmax per 256 elements, the 2024 releases 2048
    bnb.optim.GlobalOptimManager.get_instance().initialize()
