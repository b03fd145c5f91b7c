"""Padding-free batches (DataCollatorWithFlattening) and ``avg_seq_len`` pricing, checked on real CPU tensors.

References: each sample's loss computed alone (no neighbour to contaminate it), live bytes of a flattened
and of a padded batch measured by the tracer's accounting, and hand-derived token counts.
"""

from __future__ import annotations

import pytest

try:
    from helpers import hardware, make_rec, tiny_model, tiny_spec
except ImportError:  # run from the repo root
    from tests.helpers import hardware, make_rec, tiny_model, tiny_spec

torch = pytest.importorskip("torch")

from perfguide.memory import estimate_memory  # noqa: E402
from perfguide.setup import Setup  # noqa: E402
from perfguide.speed import estimate_speed  # noqa: E402

LENGTHS = (5, 11, 3, 9)


def _samples(seed: int = 0) -> list[dict[str, list[int]]]:
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(0, 128, (n,), generator=g).tolist() for n in LENGTHS]
    return [{"input_ids": r, "labels": r} for r in rows]


def _mixed(model: object, samples: list[dict[str, list[int]]]) -> float:
    """Largest logit difference between the flattened batch and each sample run alone."""
    from transformers import DataCollatorWithFlattening

    batch = DataCollatorWithFlattening()(samples)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits[0]
        alone = torch.cat([model(input_ids=torch.tensor([s["input_ids"]])).logits[0] for s in samples])
    return float((logits - alone).abs().max())


def test_without_the_plan_the_default_cache_mixes_samples():
    """transformers 5.x builds a KV cache whenever use_cache is on, and then skips the packed-sequence mask."""
    assert _mixed(tiny_model().eval(), _samples()) > 1e-2
    prepared = make_rec({"device": "cpu", "seq_len": 16, "padding_free": True}).prepare_model(tiny_model().eval())
    assert prepared.config.use_cache is False and _mixed(prepared, _samples()) < 1e-4


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_flattened_batch_keeps_samples_apart(attn):
    from transformers import DataCollatorWithFlattening

    rec = make_rec({"device": "cpu", "seq_len": 16, "padding_free": True, "attn_implementation": attn})
    model = rec.prepare_model(tiny_model(attn_implementation=attn).eval())
    samples = _samples()
    batch = DataCollatorWithFlattening()(samples)
    assert batch["input_ids"].shape == (1, sum(LENGTHS))          # one row, not a single pad token
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits[0]
        start = 0
        for s in samples:
            alone = model(input_ids=torch.tensor([s["input_ids"]])).logits[0]
            torch.testing.assert_close(logits[start:start + len(s["input_ids"])], alone, rtol=1e-4, atol=1e-5)
            start += len(s["input_ids"])


def test_plan_collator_trains_in_a_real_trainer(tmp_path):
    from transformers import DataCollatorWithFlattening, Trainer

    rec = make_rec({"device": "cpu", "seq_len": 16, "micro_batch_size": 4, "padding_free": True, "avg_seq_len": 7})
    collator = rec.data_collator()
    assert isinstance(collator, DataCollatorWithFlattening) and collator.return_flash_attn_kwargs is False
    args = rec.training_args(output_dir=str(tmp_path), max_steps=2, report_to=[], save_strategy="no", remove_unused_columns=False)
    model = rec.prepare_model(tiny_model())
    before = [p.detach().clone() for p in model.parameters()]
    Trainer(model=model, args=args, train_dataset=_samples() * 2, data_collator=collator).train()
    assert any(not torch.equal(b, p.detach()) for b, p in zip(before, model.parameters()))
    assert make_rec({"device": "cpu", "seq_len": 16}).data_collator() is None


def _live_activation_bytes(input_ids: object, **kw: object) -> int:
    """Bytes born in forward that are still alive at its end (what backward keeps), measured on real tensors."""
    from perfguide.memory.tracing.tracker import make_tracker

    model = tiny_model(hidden_size=64, intermediate_size=128, vocab_size=64)
    tracker = make_tracker(1)
    with tracker:
        out = model(input_ids=input_ids, **kw)
        tracker.set_phase("backward")   # a phase boundary records the live bytes at the end of forward
    kept = tracker.peaks["backward"][0]
    del out
    return kept


def test_activations_follow_real_tokens_measured():
    """A padded batch keeps activations for every slot; the flattened one only for real tokens."""
    from transformers import DataCollatorWithFlattening

    lengths = (8, 8, 8, 8)                   # 32 real tokens; padded to 64 per row they fill 256 slots
    rows = [torch.randint(0, 64, (n,)).tolist() for n in lengths]
    flat = DataCollatorWithFlattening()([{"input_ids": r} for r in rows])
    padded = torch.zeros(4, 64, dtype=torch.long)
    measured = _live_activation_bytes(flat["input_ids"], position_ids=flat["position_ids"]) / _live_activation_bytes(padded)
    spec = tiny_spec(hidden_size=64, intermediate_size=128, vocab_size=64, head_dim=16,
                     total_params=sum(p.numel() for p in tiny_model(hidden_size=64, intermediate_size=128, vocab_size=64).parameters()),
                     embedding_params=64 * 64, lm_head_params=64 * 64)
    base = dict(device="cpu", seq_len=64, micro_batch_size=4, optimizer=None)
    pf, pad = estimate_memory(spec, Setup(**base, padding_free=True, avg_seq_len=8)), estimate_memory(spec, Setup(**base, avg_seq_len=8))
    predicted = (pf.activations + pf.logits) / (pad.activations + pad.logits)
    assert measured < 0.3                    # 32 of 256 slots: far less than the padded batch
    assert abs(predicted - measured) < 0.1, (predicted, measured)


def test_avg_seq_len_prices_padding_and_padding_free():
    from test_speed import llama7b

    spec = llama7b()    # a 7B step is compute-bound; the tiny Llama's is launch-bound (the host dispatches its ops slower)
    a100 = hardware("a100")
    padded = Setup(seq_len=2048, micro_batch_size=4, avg_seq_len=512, autocast="bf16", attn_implementation="flash_attention_2")
    packed = padded.replace(padding_free=True) if hasattr(padded, "replace") else padded.model_copy(update={"padding_free": True})
    full = padded.model_copy(update={"avg_seq_len": None})
    t_pad, t_pf, t_full = (estimate_speed(spec, s, a100) for s in (padded, packed, full))
    # padded batches pay for seq_len: same step as full-length samples, but a quarter of the tokens are real
    assert t_pad.step_time_s == pytest.approx(t_full.step_time_s)
    assert t_pad.tokens_per_s == pytest.approx(t_full.tokens_per_s / 4)
    assert t_pf.step_time_s < t_pad.step_time_s and t_pf.tokens_per_s > t_pad.tokens_per_s
    m_pf, m_pad = estimate_memory(spec, packed, a100), estimate_memory(spec, padded, a100)
    assert m_pf.activations < m_pad.activations and m_pf.logits == pytest.approx(m_pad.logits / 4, rel=0.01)
