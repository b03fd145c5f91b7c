"""ms-swift's benchmark document (modelscope/swift docs/source/LLM/Benchmark.md at 4312aeb2, 2024-01-04; rows 1900-1995):
every row of its seven training tables, each read back as the `swift sft` run the table varies from the document's
stated defaults (max_length 2048, batch 1, gradient checkpointing, flash attention, LoRA r=8 on c_attn, accumulation
16, bf16 on an A100). Rows perfguide cannot price (GPTQ bases, a 2-GPU layer split, models outside the offline
catalog) are skipped with that reason; the errors on the rest are reported by bench/accuracy.py."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
from helpers import load_bench

ROOT = Path(__file__).resolve().parents[1]
GROUP = "swift_benchmark_doc"
#: rows per table, as the document prints them
TABLES = {"Quantization": 12, "Model Type & Max Length (LoRA)": 50, "Model Type & Max Length (full)": 15, "Batch Size": 4,
          "Use Flash Attn & Gradient Checkpointing": 4, "LoRA Rank & LoRA Target Modules": 4, "Gradient Accumulation Steps": 7}


def _rows() -> list[dict[str, str]]:
    with (ROOT / "bench" / "data" / "published_measurements.csv").open(encoding="utf-8") as fh:
        return [r for r in csv.DictReader(fh) if r["source_group"] == GROUP]


def _table(row: dict[str, str]) -> str:
    return re.search(r"table '([^']+)'", row["source"]).group(1)  # type: ignore[union-attr]


def _cells(row: dict[str, str]) -> list[str]:
    """The document's table row, as the notes quote it."""
    return re.search(r" row (.*?); doc:", row["notes"]).group(1).split(" | ")  # type: ignore[union-attr]


def test_every_table_row_is_one_csv_row() -> None:
    rows = _rows()
    assert [int(r["row_id"]) for r in rows] == list(range(1900, 1996))
    assert {t: sum(_table(r) == t for r in rows) for t in TABLES} == TABLES


#: models the bench can price (catalog entries or bench/accuracy_configs.py); the doc's other models stay skipped
PRICED_MODELS = ("Qwen/Qwen-1_8B-Chat", "Qwen/Qwen-7B-Chat", "Qwen/Qwen-14B-Chat", "01-ai/Yi-6B-Chat", "01-ai/Yi-34B-Chat",
                 "ZhipuAI/chatglm3-6b", "baichuan-inc/Baichuan2-7B-Chat")


def _priced() -> list[dict[str, str]]:
    return [r for r in _rows() if r["model_hf_id"] in PRICED_MODELS
            and r["num_gpus"] == "1" and not r["quantization"].startswith("GPTQ")]


@pytest.mark.parametrize("row", _priced(), ids=lambda r: r["row_id"])
def test_qwen_rows_read_as_the_run_the_table_varies(row: dict[str, str]) -> None:
    setup_mod = load_bench("accuracy_setup")
    spec = load_bench("accuracy_spec")._spec(row["model_hf_id"])
    setup = setup_mod._train_setup(row, spec)
    cells, table = _cells(row), _table(row)
    assert setup.seq_len == (int(cells[1]) if table.startswith("Model Type") else 2048)
    assert setup.micro_batch_size == (int(cells[1]) if table == "Batch Size" else 1)
    assert setup.gradient_accumulation_steps == (int(cells[1]) if table.startswith("Gradient Acc") else 16)
    flash, ckpt = (cells[1] == "&#x2714;", cells[2] == "&#x2714;") if table.startswith("Use Flash") else (True, True)
    assert setup.gradient_checkpointing == ckpt
    assert setup.attn_implementation == ("flash_attention_2" if flash else "sdpa")
    assert setup.weights_dtype == ("nf4" if "bnb" in row["quantization"] else "bf16")
    assert not (row["quantization"] and setup.kbit_upcast)   # swift never calls prepare_model_for_kbit_training
    if "full" in table:
        assert setup.lora is None
    else:
        assert setup.lora is not None and setup.lora.r == (int(cells[1]) if table.startswith("LoRA Rank") else 8)
        assert setup.lora.dropout == 0.05 and setup.lora.alpha == 32


def test_the_published_trainable_counts_are_lora_on_the_fused_qkv() -> None:
    """Qwen-1-7B: c_attn 4096 -> 12288 (q, k, v fused), attn.c_proj 4096 -> 4096, w1 / w2 4096 -> 11008, mlp.c_proj
    11008 -> 4096, 32 blocks; LoRA trains r x (in + out) per adapted Linear. The table's 'Trainable Params (M)'."""
    per_layer = {"DEFAULT": 4096 + 12288, "ALL": (4096 + 12288) + (4096 + 4096) + 3 * (4096 + 11008)}
    rows = [r for r in _rows() if _table(r) == "LoRA Rank & LoRA Target Modules"]
    for r in rows:
        cells = _cells(r)
        want = int(cells[1]) * per_layer[cells[2].split()[0]] * 32
        assert float(cells[5]) == pytest.approx(want / 1e6, abs=0.005)


def test_rows_outside_perfguide_are_skipped_with_their_reason() -> None:
    setup_mod, spec_mod = load_bench("accuracy_setup"), load_bench("accuracy_spec")
    for r in _rows():
        if r in _priced():
            continue
        with pytest.raises(setup_mod.Skip):
            setup_mod._train_setup(r, spec_mod._spec(r["model_hf_id"]))


# --- the April-May 2024 tuner campaign (scripts/benchmark/config/tuner.json; rows 2000-2030) ---------------------------

TUNERS = "swift_benchmark_doc_tuners"


def _tuner_rows() -> list[dict[str, str]]:
    with (ROOT / "bench" / "data" / "published_measurements.csv").open(encoding="utf-8") as fh:
        return [r for r in csv.DictReader(fh) if r["source_group"] == TUNERS]


def test_every_tuner_campaign_row_is_one_csv_row() -> None:
    rows = _tuner_rows()
    assert [int(r["row_id"]) for r in rows] == list(range(2000, 2031))
    counts = {t: sum(f"table '{t}'" in r["source"] for r in rows) for t in ("Tuners", "unsloth", "AWQ", "AQLM", "Sequence Parallel")}
    assert counts == {"Tuners": 24, "unsloth": 1, "AWQ": 1, "AQLM": 1, "Sequence Parallel": 4}


@pytest.mark.parametrize("row", [r for r in _tuner_rows() if r["method"].startswith(("LoRA (swift sft --sft_type", "full fine-tuning"))],
                         ids=lambda r: r["row_id"])
def test_tuner_campaign_rows_read_as_tuner_json(row: dict[str, str]) -> None:
    """tuner.json's args: batch 1, max_length 2048, accumulation 16, flash attention, checkpointing; LoRA r=8 alpha 32
    on every block Linear ('ALL'); the one DDP run on 2 GPUs."""
    setup = load_bench("accuracy_setup")._train_setup(row, load_bench("accuracy_spec")._spec(row["model_hf_id"]))
    assert (setup.micro_batch_size, setup.seq_len, setup.gradient_accumulation_steps) == (1, 2048, 16)
    assert setup.gradient_checkpointing and setup.attn_implementation == "flash_attention_2"
    assert (setup.strategy, setup.num_gpus) == (("ddp", 2) if "*2" in row["notes"] else ("single", 1))
    if setup.lora is not None:
        assert (setup.lora.r, setup.lora.alpha, setup.lora.dropout) == (8, 32, 0.05)
        assert setup.lora.use_dora == ("use_dora=True" in row["notes"])
        assert "17.8913" in row["notes"] or "19.2512" in row["notes"]   # r=8 on every fused Linear (DoRA: + magnitudes)


@pytest.mark.parametrize("quant", ["AWQ (qwen1half-7b-chat-awq)", "AQLM (llama2-7b-aqlm-2bit-1x16)", "GPTQ int4 (auto_gptq)"])
def test_pre_quantized_checkpoints_are_skipped(quant: str) -> None:
    setup_mod = load_bench("accuracy_setup")
    row = next(r for r in _priced() if not r["quantization"])
    with pytest.raises(setup_mod.Skip, match=quant.split()[0]):
        setup_mod._train_setup({**row, "quantization": quant}, load_bench("accuracy_spec")._spec(row["model_hf_id"]))


# --- the open gap (bench/accuracy_swift_gap.py): what the code that ran holds, by hand --------------------------------

def _row(row_id: str) -> dict[str, str]:
    return next(r for r in _rows() + _tuner_rows() if r["row_id"] == row_id)


def test_qwen1_loss_path_is_priced_at_its_hand_count() -> None:
    """Qwen-1's QWenLMHeadModel.forward under accelerate's bf16 autocast peaks in the loss's backward: the fp32
    log-softmax cross_entropy saved (4, autocast fp32 list), its incoming gradient (4) and its input gradient (4) = 12 B
    per logit (the forward holds 2 + 4 + 4 at batch 1); 1 x 2048 x 151,936 logits (Qwen-7B's vocab) for row 1919.
    The priced logits term must be that."""
    acc = load_bench("accuracy")
    row = _row("1919")
    spec = load_bench("accuracy_spec")._spec(row["model_hf_id"])
    setup = load_bench("accuracy_setup")._train_setup(row, spec)
    est = acc.estimate_memory(spec, setup, acc._hardware(row["gpu_type"], 1))
    assert est.logits == pytest.approx((4 + 4 + 4) * 1 * 2048 * 151_936, rel=0.005)


def test_gap_per_logit_is_the_residual_over_batch_length_and_vocab() -> None:
    """Row 1919: 27.74 - 20.58 = 7.16 GiB over 1 x 2048 x 151,936 logits = 24.71 B; row 1924 (Qwen-14B, vocab
    152,064): 40.14 - 34.37 = 5.77 GiB over 311,427,072 logits = 19.89 B."""
    gap = load_bench("accuracy_swift_gap")
    assert gap.gap_per_logit(_row("1919"), 27.74, 20.58) == pytest.approx(7.16 * 2**30 / 311_164_928, rel=1e-9)
    assert gap.gap_per_logit(_row("1919"), 27.74, 20.58) == pytest.approx(24.71, abs=0.01)
    assert gap.gap_per_logit(_row("1924"), 40.14, 34.37) == pytest.approx(19.89, abs=0.01)


def test_samples_drawn_follows_run_single() -> None:
    """run_single.py: ``train_dataset_sample = 1000`` when max_length > 2048, else -1 (every kept sample)."""
    gap = load_bench("accuracy_swift_gap")
    assert [gap.samples_drawn(_row(i)) for i in ("1912", "1914", "1915", "1916", "2013")] == [
        "all kept", "all kept", "1000 sampled", "1000 sampled", "tuner.json, 2 epochs"]


def test_published_full_fine_tuning_falls_with_length_where_every_priced_term_grows() -> None:
    """The evidence against a fixed per-logit term: Qwen-1.8B full fine-tuning publishes more at 2048 tokens (whole
    dataset) than at 4096 (1000 samples), while the priced peak grows with the length."""
    acc = load_bench("accuracy")
    published = {i: float(_row(i)["peak_mem_value"]) for i in ("1964", "1965")}
    assert published["1964"] > published["1965"]
    priced = {i: acc.evaluate(_row(i), []).predicted for i in ("1964", "1965")}
    assert priced["1964"] < priced["1965"]


def test_swift_gap_section_lists_every_priced_swift_row() -> None:
    acc, gap = load_bench("accuracy"), load_bench("accuracy_swift_gap")
    values = [r for r in (acc.evaluate(row, []) for row in _rows() + _tuner_rows()) if r.kind == "value"]
    lines = gap.swift_gap(values)
    listed = [ln.split(" | ")[0].lstrip("| ") for ln in lines if ln.startswith("| 19") or ln.startswith("| 20")]
    assert listed == [r.row["row_id"] for r in values] and len(listed) == 81   # 58 Qwen-1 rows, 23 Yi / ChatGLM3 / Baichuan2


def test_qwen1_loss_lines_traced_on_cpu_hold_12_bytes_per_logit() -> None:
    """The loss as Qwen-1's QWenLMHeadModel.forward and swift's compute_loss run it (bf16 head, shift, cross-entropy
    under the CUDA autocast lists, accelerate's fp32 copy of the returned logits, swift's argmax), traced for live
    bytes on real CPU tensors. Hand count at batch 1: forward 2 (logits) + 4 (fp32 upcast) + 4 (log-softmax) = 10 B
    per logit (the shifted slice of one sequence is contiguous: no copy); backward 4 (saved log-softmax) + 4
    (incoming gradient) + 4 (input gradient) = 12 B per logit, the step's loss peak."""
    import torch
    import torch.nn.functional as F

    from perfguide.memory.tracing.cuda_emulation import make_cuda_emulation
    from perfguide.memory.tracing.tracker import make_tracker

    torch.manual_seed(0)
    hidden_size, seq, vocab = 16, 256, 4096
    head = torch.nn.Linear(hidden_size, vocab, bias=False, dtype=torch.bfloat16).requires_grad_(False)
    hidden = torch.randn(1, seq, hidden_size, dtype=torch.bfloat16, requires_grad=True)  # LoRA blocks below need it
    labels = torch.randint(0, vocab, (1, seq))
    tracker, emulation = make_tracker(1), make_cuda_emulation(torch.bfloat16, emulate_sdpa=False)
    with tracker:
        tracker.set_phase("forward")
        with emulation:
            logits = head(hidden)
            shift = logits[..., :-1, :].contiguous()
            loss = F.cross_entropy(shift.view(-1, vocab), labels[..., 1:].contiguous().view(-1))
            emulation.casting = False                  # accelerate wraps only the forward in autocast
            returned = logits.float()                  # convert_outputs_to_fp32
            del logits, shift
            preds = returned.argmax(dim=2)             # swift's token accuracy
            del returned, preds                        # compute_loss returns the loss only
            emulation.end_region()
            tracker.set_phase("backward_head")
            emulation.backward(loss)
    per_logit = {phase: peak[0] / (seq * vocab) for phase, peak in tracker.peaks.items()}
    assert per_logit["forward"] == pytest.approx(10, abs=0.2)
    assert per_logit["backward_head"] == pytest.approx(12, abs=0.2)
