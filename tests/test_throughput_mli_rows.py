"""mli/transformers-benchmarks' transformers.ipynb (published_throughput.csv 700-730): both notebook revisions whole,
each rate the notebook's own printed figure, and the rows read as the HF Trainer runs the cells launch.

The notebook runs transformers' run_mlm.py / run_clm.py on wikitext-2 cut into blocks of exactly the sequence length
(group_texts), so every sample is seq_len tokens, and prints HF Trainer's train_samples_per_second ('Total samples /
second'): max_steps x batch x grad_accum x GPUs over the whole trainer.train(). The printed figures below were read by
hand off the notebook's outputs at 50d22c84 (2022-08-19) and cd48272 (2022-09-02), never from what perfguide predicts.
"""

from __future__ import annotations

import math
import re
from types import ModuleType

import pytest
from helpers import load_bench, throughput_rows_in

MLI = range(700, 731)

#: row -> the 'Total samples / second' its notebook cell printed (hand-read off the .ipynb outputs)
PRINTED = {"700": 87.1, "701": 128.0, "702": 143.3, "703": 147.8, "704": 161.1, "705": 139.5, "706": 13.1, "707": 21.0,
           "708": 252.6, "709": 317.8, "710": 305.9, "711": 297.5, "712": 7.0, "713": 5.7, "714": 2.2,
           "715": 15.6, "720": 7.7}


@pytest.fixture(scope="module")
def rows() -> ModuleType:
    return load_bench("throughput_rows")


@pytest.fixture(scope="module")
def loaded(rows: ModuleType) -> tuple[dict, dict[str, str], list[dict[str, str]], list[dict[str, str]]]:
    return throughput_rows_in(rows, MLI)


def test_every_cell_of_both_revisions_is_a_row_and_each_rate_is_its_printed_figure(loaded) -> None:
    """15 HF/DeepSpeed cells at 50d22c84; 16 cells at cd48272 (6 HF, 1 DeepSpeed, 9 Megatron-LM), 2 of them printed."""
    _, _, raw, _ = loaded
    assert [int(r["row_id"]) for r in raw] == list(MLI)
    tables = {t: sum(f"table '{t}'" in r["notes"] for r in raw) for t in ("2022-08-19 notebook", "2022-09-02 notebook")}
    assert tables == {"2022-08-19 notebook": 15, "2022-09-02 notebook": 16}
    for r in raw:
        said = re.search(r"printed 'Total samples / second : ([\d.]+)'", r["notes"])
        if r["row_id"] in PRINTED:
            assert said and float(said.group(1)) == float(r["samples_per_s"]) == PRINTED[r["row_id"]], r["row_id"]
        else:   # SVG-only cells and Megatron's time breakdowns: no rate to quote, no value in any rate column
            assert not said and "prints no rate" in r["notes"], r["row_id"]
            assert not (r["samples_per_s"] or r["tokens_per_s_total"] or r["tokens_per_s_per_gpu"]), r["row_id"]
        assert int(r["global_batch"]) * (2 if "TP 2" in r["sharding"] else 1) == \
            int(r["micro_batch"]) * int(r["grad_accum"]) * int(r["num_gpus"]), r["row_id"]


def test_a_single_gpu_row_reads_as_the_hf_trainer_run_its_cell_launches(loaded) -> None:
    """bert_2: Config('bert-large-uncased', 128, 56, bf16=True) -> 56 x 128-token blocks, bf16 autocast over fp32
    weights, transformers' per-tensor AdamW (the Config default 'adamw_hf'), 20 steps timed with the start-up."""
    by_id, _, _, _ = loaded
    row = by_id["701"]
    assert row.published == pytest.approx(128.0 * 128)          # samples/s x tokens per sample, one GPU
    assert (row.group, row.table, row.framework) == (
        "mli-transformers-benchmarks", "mli-transformers-benchmarks: 2022-08-19 notebook", "hf_trainer")
    s = row.setup
    assert (s.micro_batch_size, s.seq_len, s.gradient_accumulation_steps, s.world_size, s.strategy) == (56, 128, 1, 1, "single")
    assert (s.weights_dtype, s.autocast, s.optimizer, s.gradient_checkpointing, s.attn_implementation) == (
        "fp32", "bf16", "adamw_torch", False, "eager")
    assert row.optimizer_impl == "per_tensor_loop" and row.steps == 20 and s.lora is None
    assert row.hardware.smallest_gpu is not None and row.hardware.smallest_gpu.name == "rtx3090ti"
    assert row.spec.vocab_size == 30522 and row.spec.num_layers == 24 and row.spec.hidden_size == 1024


def test_the_other_cells_keep_their_optimizer_checkpointing_steps_and_launcher(loaded) -> None:
    by_id, _, _, _ = loaded
    fp32 = by_id["700"].setup
    assert (fp32.weights_dtype, fp32.autocast) == ("fp32", None)
    apex = by_id["703"]                                          # --optim adamw_apex_fused: one multi-tensor kernel
    assert apex.setup.optimizer == "adamw_torch_fused" and apex.optimizer_impl is None
    ckpt = by_id["705"]                                          # mb 260, grad_accum 4, gradient checkpointing, 5 steps
    assert ckpt.setup.gradient_checkpointing and ckpt.setup.gradient_accumulation_steps == 4 and ckpt.steps == 5
    ddp = by_id["709"]                                           # torch.distributed.launch over the two cards
    assert (ddp.setup.strategy, ddp.setup.world_size, ddp.hardware.name) == ("ddp", 2, "rtx3090ti:2")
    assert ddp.published == pytest.approx(317.8 * 128 / 2)      # train_samples_per_second counts both ranks
    gpt = by_id["720"]                                           # HEAD revision: seq_len = gpt2-medium's 1024 positions
    assert (gpt.setup.seq_len, gpt.setup.micro_batch_size, gpt.setup.gradient_accumulation_steps) == (1024, 2, 4)
    assert gpt.table == "mli-transformers-benchmarks: 2022-09-02 notebook" and gpt.published == pytest.approx(7.7 * 1024)
    assert sorted(by_id[k].row_id for k in by_id if int(k) in MLI) == [
        "700", "701", "702", "703", "704", "705", "706", "707", "709", "710", "715", "720"]


def test_rows_perfguide_cannot_state_say_why(loaded) -> None:
    _, why, _, _ = loaded
    assert "DataParallel" in why["708"]                          # one process scattering to both cards
    assert all("offload" in why[k] for k in ("711", "712", "713", "714"))   # ZeRO-2 with optimizer CPU offload
    assert all("prints no rate" in why[str(k)] for k in (*range(716, 720), *range(721, 731)))
    assert len([k for k in why if int(k) in MLI]) == 19


def test_the_rtx_3090_ti_is_not_read_as_an_rtx_3090(rows: ModuleType) -> None:
    """The publisher's 'RTX 3090 Ti' must reach the 84-SM, 1,008 GB/s card, not the 'rtx 3090' needle's 82-SM one."""
    hw = rows._hardware({"gpu_type": "RTX 3090 Ti 24GB", "notes": ""}, 1, 1)
    gpu = hw.smallest_gpu
    assert gpu is not None and (gpu.name, gpu.multiprocessors, gpu.memory_bandwidth_gbps) == ("rtx3090ti", 84, 1008)
    assert gpu.bf16_tflops == pytest.approx(84 * 512 * 1.86e9 / 1e12, rel=1e-3)   # GA102's 512 FLOP/clk/SM at 1.86 GHz
    assert rows._hardware({"gpu_type": "RTX 3090", "notes": ""}, 1, 1).smallest_gpu.name == "rtx3090"


def test_every_priced_row_is_evaluated(loaded) -> None:
    by_id, _, _, _ = loaded
    throughput = load_bench("throughput")
    for key, case in by_id.items():
        if int(key) in MLI:
            tokens = throughput.predict(case)
            assert math.isfinite(tokens) and tokens > 0, key
