"""trainer='torchtune': torchtune's LinearCrossEntropyLoss, priced per logit (techniques/torchtune_loss.py), against
its own op sequence run on real CPU tensors, and the torchtune configs that name it read as that loop.

torchtune is not installed here; ``_linear_ce`` runs the ops of LinearCrossEntropyLoss.forward / mask_inputs /
compute_cross_entropy as torchtune/modules/loss/cross_entropy_loss.py writes them (index_select of the labelled
positions, ``tensor_split`` into 8 chunks, ``F.linear`` then ``F.cross_entropy(logits.float(), reduction="sum")``
in a function, so a chunk's logits die with its call), and a dispatch mode counts every storage those ops create
until it is freed."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from helpers import live_storages

import perfguide
from perfguide.techniques.torchtune_loss import CHUNKS, EAGER_PER_LOGIT, loss_bytes

DATA = Path(__file__).parent / "data" / "check"


def _linear_ce(b: int, s: int, h: int, vocab: int) -> int:
    """Peak bytes the loss's forward and backward create, the model's hidden states and head weight not counted (the
    head frozen, as under LoRA: a trained head's gradient is the grads term's, priced beside the loss path)."""
    torch.manual_seed(0)
    hidden = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(vocab, h, dtype=torch.bfloat16)
    target = torch.randint(0, vocab, (b, s))

    def compute_cross_entropy(chunk: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = F.linear(chunk, weight)
        return F.cross_entropy(logits.float(), labels, reduction="sum", ignore_index=-100)

    live = live_storages(hidden, weight, target)
    with live:
        flat, labels = hidden.reshape(-1, h), target.reshape(-1)
        keep = torch.where(labels != -100)[0]
        flat, labels = flat.index_select(0, keep), labels.index_select(0, keep)
        total = torch.zeros((), dtype=torch.float32)
        for chunk, chunk_labels in zip(flat.tensor_split(CHUNKS, dim=0), labels.tensor_split(CHUNKS, dim=0)):
            total = total + compute_cross_entropy(chunk, chunk_labels)
        (total / keep.numel()).backward()
    return live.peak


@pytest.mark.parametrize(("b", "s", "h", "vocab"), [(2, 512, 64, 4096), (1, 1024, 128, 8192)])
def test_eager_peak_is_the_traced_one(b: int, s: int, h: int, vocab: int) -> None:
    """Every chunk's saved fp32 log-softmax (4 B per logit) and, at the first chunk's log-softmax backward, its two fp32
    gradients (8 B / 8), plus the 16-bit copy of the selected hidden states: within 5% of the traced peak (the rest
    is the labels, the loss scalars and the index tensors)."""
    spec = SimpleNamespace(hidden_size=h, vocab_size=vocab)   # the two sizes the loss path reads
    shape = perfguide.Setup(task="train", micro_batch_size=b, seq_len=s)
    priced = loss_bytes(spec, shape, compiled=False)
    assert priced == int(EAGER_PER_LOGIT * b * s * vocab) + b * s * h * 2
    traced = _linear_ce(b, s, h, vocab)
    assert traced * 0.95 <= priced <= traced


def test_a_torchtune_config_is_priced_as_its_own_loss() -> None:
    """torchtune's llama3_2/1B_lora_single_device (tests/data/check, LinearCrossEntropyLoss): read as trainer='torchtune',
    so the loss path is the chunked loss's, not HF's 12 B per logit over full logits; the same Setup with
    trainer='transformers' prices more by the difference of the two per-logit counts."""
    c = perfguide.check("meta-llama/Llama-3.2-1B", DATA / "torchtune_llama3_2_1B_lora_single_device.yaml", hardware="rtx4090", seq_len=2048)
    assert c.setup.trainer == "torchtune"
    hf = perfguide.estimate("meta-llama/Llama-3.2-1B", c.setup.model_copy(update={"trainer": "transformers"}), hardware="rtx4090")
    assert hf.peak_allocated > c.memory.peak_allocated


def test_liger_is_refused_beside_torchtunes_loop() -> None:
    with pytest.raises(perfguide.PerfGuideError, match="liger_kernel runs under the transformers / trl training loop, not trainer='torchtune'"):
        perfguide.estimate("meta-llama/Llama-3.2-1B", {"micro_batch_size": 1, "seq_len": 512, "trainer": "torchtune",
                                                       "liger_kernel": True}, hardware="rtx4090")


def test_a_torchtune_plan_says_its_outputs_are_not_torchtunes() -> None:
    """recommend(trainer='torchtune') prices torchtune's loop, but the files a plan writes are Hugging Face's: the plan
    says so rather than hand a torchtune user TrainingArguments as if they ran that loop."""
    rec = perfguide.recommend("meta-llama/Llama-3.2-1B", "train_gpu_one", hardware="rtx4090", trainer="torchtune")
    assert rec.setup.trainer == "torchtune" and not rec.setup.liger_kernel
    assert any(w.startswith("trainer='torchtune'") and "torchtune config" in w for w in rec.warnings)
