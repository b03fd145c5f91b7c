"""Pure bf16 weights under FSDP2 (issue 11 item 10): priced per GPU by hand, emitted as accelerate needs it, and checked
with accelerate's own ``fsdp2_prepare_model`` on a real one-rank gloo group: with mixed_precision "no" the shards and
the AdamW states stay bf16, with "bf16" accelerate upcasts them to fp32 (the reason the emission must say "no")."""

from __future__ import annotations

import pytest

import perfguide as pg
from perfguide.errors import ConflictingConstraintsError

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

try:
    from helpers import GiB, accelerate_fsdp2, make_rec, tiny_model
except ImportError:  # pragma: no cover
    from tests.helpers import GiB, accelerate_fsdp2, make_rec, tiny_model

MODEL = "meta-llama/Llama-3.1-8B"


@pytest.fixture(scope="module")
def pure_fsdp():
    return pg.recommend(MODEL, scenario="train_gpu_many", hardware="a100-80gb:8", master_weights="bf16", strategy="fsdp")


def test_pure_bf16_is_planned_under_fsdp2(pure_fsdp):
    s = pure_fsdp.setup
    assert s.strategy == "fsdp" and s.weights_dtype == "bf16" and s.lora is None and s.fsdp_version == 2


def test_sharded_states_match_hand_formula(pure_fsdp):
    """bf16 weights (2 B), bf16 grads (2 B) and AdamW's two bf16 moments (4 B), each split over 8 ranks."""
    p = pure_fsdp.model.total_params
    m = pure_fsdp.memory
    assert m.weights == pytest.approx(2 * p / 8, rel=1e-6)
    assert m.gradients == pytest.approx(2 * p / 8, rel=1e-6)
    assert m.optimizer_states == pytest.approx(4 * p / 8, rel=0.01)


def test_emission_keeps_accelerate_out_of_mixed_precision(pure_fsdp, tmp_path):
    from accelerate.commands.config.config_args import load_config_from_file

    kw = pure_fsdp.training_args_dict()
    assert "bf16" not in kw and "fp16" not in kw and kw["fsdp"] is True
    assert pure_fsdp.model_kwargs()["dtype"] == torch.bfloat16
    cfg = load_config_from_file(str(pure_fsdp.write_accelerate_config(tmp_path / "acc.yaml")))
    assert cfg.mixed_precision == "no" and cfg.fsdp_config["fsdp_version"] == 2


def test_master_weights_decision_states_the_trade(pure_fsdp):
    d = next(d for d in pure_fsdp.decisions if d.setting == "master_weights")
    assert d.value == "bf16" and "arXiv:2010.06192" in d.source and "GiB less" in d.reason
    # the fp32 alternative, priced: its model states per GPU are 16 B/param / 8 against 8 B/param / 8 here
    fp32 = next(a for a in d.alternatives if a.value == "fp32")
    assert fp32.number > pure_fsdp.memory.device_total
    saved = pure_fsdp.model.total_params * (16 - 8) / 8 / GiB
    assert f"{saved:.1f} GiB less" in d.reason


def test_default_plan_keeps_fp32_masters_and_says_what_bf16_would_save():
    rec = pg.recommend(MODEL, scenario="train_gpu_many", hardware="a100-80gb:8")
    d = next(d for d in rec.decisions if d.setting == "master_weights")
    assert d.value == "fp32" and rec.setup.weights_dtype == "fp32"
    assert "pure bf16 holds" in d.reason and d.alternatives[0].value == "bf16"


def test_master_weights_bf16_with_lora_refused():
    with pytest.raises(ConflictingConstraintsError, match="applies to full fine-tuning"):
        pg.recommend(MODEL, scenario="train_gpu_many", hardware="a100-80gb:8", master_weights="bf16", finetune="lora")


def _prepare(mixed_precision: str):
    """accelerate's FSDP2 preparation of a bf16 tiny Llama on a one-rank gloo group (CPU), then one AdamW step."""
    import torch.distributed as dist

    rec = make_rec({"strategy": "fsdp", "num_gpus": 2, "weights_dtype": "bf16", "autocast": "bf16", "micro_batch_size": 1})
    model = accelerate_fsdp2(rec, tiny_model().to(torch.bfloat16), mixed_precision)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 128, (1, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    assert dist.is_initialized()
    states = [t for st in opt.state.values() for k, t in st.items() if k in ("exp_avg", "exp_avg_sq")]
    return {p.dtype for p in model.parameters()}, {t.dtype for t in states}


def test_accelerate_fsdp2_keeps_bf16_only_without_mixed_precision(gloo_group):
    rec = make_rec({"strategy": "fsdp", "num_gpus": 2, "weights_dtype": "bf16", "autocast": "bf16", "micro_batch_size": 1})
    from perfguide.techniques.precision import accelerate_mixed_precision

    emitted = accelerate_mixed_precision(rec.setup)
    assert emitted == "no"
    params, states = _prepare(emitted)
    assert params == {torch.bfloat16} and states == {torch.bfloat16}
    # what the old refusal was about: with mixed precision on, accelerate upcasts the trainable shards to fp32
    params, states = _prepare("bf16")
    assert params == {torch.float32} and states == {torch.float32}
