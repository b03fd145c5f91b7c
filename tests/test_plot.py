"""The memory plot: a real PNG, curves re-priced by the memory model, matplotlib optional."""

from __future__ import annotations

import sys

import pytest

from perfguide import Setup
from perfguide.errors import PerfGuideError
from perfguide.render.plot import micro_batch_axis, seq_len_axis, sweep, variants
from tests.test_report import make_recommendation

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def rec():
    return make_recommendation()


def test_plot_writes_a_png(rec, tmp_path):
    from matplotlib.image import imread

    path = rec.plot(tmp_path / "mem.png")
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000
    height, width, channels = imread(path).shape
    assert width > height > 200 and channels == 4   # two panels side by side, RGBA


def test_curves_follow_the_physics(rec):
    by_batch = {s.label: s for s in sweep(rec, "micro_batch_size", (1, 2, 4, 8))}
    chosen = next(s for s in by_batch.values() if s.chosen)
    assert all(y is not None for y in chosen.ys)
    assert list(chosen.ys) == sorted(chosen.ys) and chosen.ys[0] < chosen.ys[-1]   # more samples, more activations
    # the chosen setup checkpoints; dropping it keeps every activation, so it costs more at every batch size
    without = by_batch["without gradient checkpointing"]
    assert all(w > c for w, c in zip(without.ys, chosen.ys))
    by_seq = next(s for s in sweep(rec, "seq_len", (256, 1024, 4096)) if s.chosen)
    assert by_seq.ys[0] < by_seq.ys[1] < by_seq.ys[2]


def test_variants_cover_checkpointing_and_optimizers():
    train = Setup(gradient_checkpointing=False, optimizer="adamw_torch_fused")
    labels = [c.label for c in variants(train)]
    assert labels[0].startswith("chosen") and "with gradient checkpointing" in labels
    assert "optimizer adamw_bnb_8bit" in labels and "optimizer adafactor" in labels
    assert "optimizer adamw_torch_fused" not in labels     # already the chosen one
    assert [c.label for c in variants(Setup(task="infer", weights_dtype="bf16"))][1:] == ["int8 weights", "nf4 weights"]
    assert len(variants(Setup(task="infer", weights_dtype="nf4"))) == 1


def test_axes_include_the_chosen_point():
    assert micro_batch_axis(Setup(micro_batch_size=6)) == (1, 2, 4, 6, 8, 16)
    assert micro_batch_axis(Setup(micro_batch_size=32)) == (1, 2, 4, 8, 16, 32, 64, 128)
    assert seq_len_axis(Setup(seq_len=512), None) == (128, 256, 512, 1024)
    assert seq_len_axis(Setup(seq_len=2048), 1024) == (128, 256, 512, 1024, 2048)
    assert seq_len_axis(Setup(seq_len=64), 128) == (64, 128)


def test_missing_matplotlib_names_the_extra(rec, tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # what `import matplotlib` sees when it is not installed
    with pytest.raises(PerfGuideError, match=r"pip install perfguide\[plot\]"):
        rec.plot(tmp_path / "mem.png")


def test_missing_folder_is_a_clear_error(rec, tmp_path):
    with pytest.raises(PerfGuideError, match="does not exist"):
        rec.plot(tmp_path / "nope" / "mem.png")


def _labels(fig) -> str:
    texts = [fig.get_suptitle()] + [ax.get_ylabel() for ax in fig.axes]
    texts += [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    return "\n".join(texts)


def test_gpu_plot_is_in_device_words(rec):
    from perfguide.render.plot import memory_figure

    labels = _labels(memory_figure(rec))
    assert "device memory (80.0 GiB)" in labels and "peak device memory" in labels and "per device" in labels


def test_cpu_plot_is_in_process_and_ram_words():
    from perfguide.render.plot import memory_figure
    from tests.test_report import cpu_recommendation

    labels = _labels(memory_figure(cpu_recommendation()))
    assert "available RAM (900.0 GiB)" in labels and "process memory, RSS" in labels and "per process" in labels
    assert "device" not in labels
