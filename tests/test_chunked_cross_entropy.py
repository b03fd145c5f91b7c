"""axolotl's ``chunked_cross_entropy`` (techniques/chunked_cross_entropy.py), against axolotl's own loss code run on
real CPU tensors, and axolotl configs that set it read and priced as that loss.

``_axolotl_loss`` is monkeypatch/loss/chunked.py's ``for_causal_lm_chunked_loss`` as axolotl writes it (labels padded
and shifted, ``source.chunk(8, dim=1)``, ``reshape(-1, V)`` per chunk, a summed cross-entropy per chunk). Its
per-chunk call is ``torch.compile``'d there; a dispatch mode cannot watch compiled code, so ``_CompiledChunkCE``
stands in with what Inductor's graph for that call allocates, read off its generated code in
tests/test_compiled_block.py: it saves its 16-bit input and one fp32 statistic per row, and its backward writes
one 16-bit buffer the size of the chunk (computed here a few rows at a time, as the fused kernel never holds an fp32
chunk)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import live_storages

import perfguide
from perfguide.errors import PerfGuideError
from perfguide.techniques.chunked_cross_entropy import loss_bytes

torch = pytest.importorskip("torch")
F = torch.nn.functional
ROWS = 16   # rows per block in the stand-in: its fp32 temporaries stay a few KB


class _CompiledChunkCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, labels):
        lse = torch.empty(x.shape[0], dtype=torch.float32)
        total = torch.zeros((), dtype=torch.float32)
        for i in range(0, x.shape[0], ROWS):
            block, lab = x[i:i + ROWS].float(), labels[i:i + ROWS]
            lse[i:i + ROWS] = torch.logsumexp(block, dim=-1)
            ok = lab != -100
            total += (lse[i:i + ROWS][ok] - block[ok, lab[ok]]).sum()
        ctx.save_for_backward(x, labels, lse)
        return total

    @staticmethod
    def backward(ctx, grad):
        x, labels, lse = ctx.saved_tensors
        out = torch.empty_like(x)
        for i in range(0, x.shape[0], ROWS):
            p, lab = torch.exp(x[i:i + ROWS].float() - lse[i:i + ROWS, None]), labels[i:i + ROWS]
            ok = lab != -100
            p[ok, lab[ok]] -= 1
            p[~ok] = 0
            out[i:i + ROWS] = (p * grad).to(x.dtype)
        return out, None


def _axolotl_loss(source, labels, num_items: int, chunks: int = 8):
    labels = F.pad(labels, (0, 1), value=-100)
    shift_labels = labels[..., 1:].contiguous()
    logit_chunks = [c.reshape(-1, c.size(-1)) for c in source.chunk(chunks, dim=1)]
    label_chunks = [t.reshape(-1) for t in shift_labels.chunk(chunks, dim=1)]
    total = 0.0
    for logits_chunk, labels_chunk in zip(logit_chunks, label_chunks):
        total += _CompiledChunkCE.apply(logits_chunk, labels_chunk)
    return total / num_items


def _traced_peak(b: int, s: int, h: int, vocab: int) -> int:
    """Peak bytes the head's matmul, the loss and its backward create (the hidden states, head weight and labels
    given); the model's output is dropped before backward, as HF Trainer's compute_loss returns the loss alone."""
    torch.manual_seed(0)
    hidden = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(vocab, h, dtype=torch.bfloat16) * 0.02
    labels = torch.randint(0, vocab, (b, s))
    live = live_storages(hidden, weight, labels)
    with live:
        logits = hidden @ weight.t()
        loss = _axolotl_loss(logits, labels, b * s)
        del logits
        loss.backward()
    return live.peak


@pytest.mark.parametrize(("b", "s", "h", "vocab"), [(1, 1024, 64, 4096), (2, 512, 64, 4096), (4, 256, 32, 8192)])
def test_peak_is_the_traced_one(b: int, s: int, h: int, vocab: int) -> None:
    """One row: the chunks are views, so the logits stay whole until the last chunk's backward while the chunks'
    gradients gather for the split's join; several rows: ``reshape`` copies each chunk, logits and copies meet at the
    forward's end. Either way two 16-bit logits per position and entry, within 5% of the trace (the rest: the
    hidden states' gradient, labels, statistics)."""
    setup = perfguide.Setup(task="train", micro_batch_size=b, seq_len=s, weights_dtype="bf16", chunked_cross_entropy=True)
    spec = perfguide.ModelSpec.from_any({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": h,
                                         "intermediate_size": 4 * h, "num_attention_heads": 4, "num_key_value_heads": 4,
                                         "num_hidden_layers": 2, "vocab_size": vocab})
    priced = loss_bytes(spec, setup, setup)
    assert priced == 4 * b * s * vocab   # by hand: two 16-bit copies of every logit
    traced = _traced_peak(b, s, h, vocab)
    assert priced <= traced <= priced * 1.05


YAML = """base_model: LiquidAI/LFM2-350M
chunked_cross_entropy: true
sequence_len: 4096
sample_packing: true
micro_batch_size: 4
gradient_accumulation_steps: 2
optimizer: adamw_torch_fused
bf16: true
tf32: true
gradient_checkpointing: false
flash_attention: true
"""


def test_an_axolotl_config_is_priced_as_its_chunked_loss(tmp_path: Path) -> None:
    """axolotl's LFM2-350M example as its README's commit ran it (130ef7c51): the loss path is two 16-bit copies of
    the 4 x 4,096 x 65,536 logits, where HF's loss on the same step holds 12 bytes per logit."""
    path = tmp_path / "lfm2-350m-fft.yaml"
    path.write_text(YAML)
    c = perfguide.check(config=path, hardware="l40s")
    assert c.setup.chunked_cross_entropy and "chunked-ce" in c.setup.label
    assert c.memory.logits == 2 * 2 * 4 * 4096 * 65536
    hf = perfguide.estimate("LiquidAI/LFM2-350M", c.setup.model_copy(update={"chunked_cross_entropy": False}), hardware="l40s")
    assert hf.logits == pytest.approx(12 * 4 * 4096 * 65536, rel=1e-3)
    assert hf.peak_allocated - c.memory.peak_allocated == hf.logits - c.memory.logits


def test_a_fused_loss_beside_it_is_refused(tmp_path: Path) -> None:
    """axolotl refuses chunked_cross_entropy with its Cut Cross-Entropy plugin (CutCrossEntropyArgs); a Setup with
    both, or with Liger's fused loss, which bypasses the loss function the patch replaces, is refused too."""
    path = tmp_path / "both.yaml"
    path.write_text(YAML + "plugins:\n  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin\n")
    with pytest.raises(PerfGuideError, match="chunked_cross_entropy replaces transformers' loss function"):
        perfguide.check(config=path, hardware="l40s")
    with pytest.raises(ValueError, match="liger_kernel's fused linear cross-entropy bypasses"):
        perfguide.Setup(task="train", chunked_cross_entropy=True, liger_kernel=True)
