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
