"""Lambda's GPU benchmark, BERT-large SQuAD fp16 column (published_throughput.csv 600-652): every system of the table
is a row, each keeps the setup its run states, and each published rate is the one its log gives.

The table value is compile_results_pytorch.py's int(round(mean of the logs' training_sequences_per_second, 2)); the log
computes that as train_batch_size x max_steps (100) x GPUs / e2e_train_time. Both are re-derived here from the
counters each row's notes quote, never from what perfguide predicts. The run is NVIDIA DeepLearningExamples'
run_squad.py: sequences padded to 384 tokens, apex amp O2, apex FusedAdam, apex DDP over the GPUs of one server.
apex O2 is read as an fp16 model without autocast (the logs print cast_model_type torch.float16 and
patch_torch_functions False), a reading only these rows carry.
"""

from __future__ import annotations

import re
from types import ModuleType

import pytest
from helpers import load_bench, throughput_rows_in

LAMBDA = range(600, 653)


@pytest.fixture(scope="module")
def rows() -> ModuleType:
    return load_bench("throughput_rows")


@pytest.fixture(scope="module")
def loaded(rows: ModuleType) -> tuple[dict, dict[str, str], list[dict[str, str]], list[dict[str, str]]]:
    return throughput_rows_in(rows, LAMBDA)


def test_every_system_of_the_column_is_a_row_and_its_rate_is_its_logs(loaded) -> None:
    """53 systems; each table value = int(round(mean over its logs of bs x 100 x GPUs / e2e_train_time, 2)): truncated."""
    _, _, raw, _ = loaded
    assert len(raw) == 53 and {r["source"] for r in raw} == {"lambdal/deeplearning-benchmark"}
    for r in raw:
        logs = re.findall(r"training_sequences_per_second ([\d.]+), e2e_train_time ([\d.]+) s", r["notes"])
        assert logs, r["row_id"]
        mb, gpus = int(r["micro_batch"]), int(r["num_gpus"])
        for rate, seconds in logs:
            assert float(rate) == pytest.approx(mb * 100 * gpus / float(seconds), rel=2e-4), r["row_id"]
        assert int(r["samples_per_s"]) == int(round(sum(float(x) for x, _ in logs) / len(logs), 2)), r["row_id"]
        assert int(r["global_batch"]) == mb * gpus and r["seq_len"] == "384"


def test_a_consumer_pair_reads_as_ddp_fp16_question_answering(loaded) -> None:
    """2x RTX 3090 (row 621): 89 sequences/s over both cards at 384 tokens -> 89 x 384 / 2 = 17088 tokens/s per GPU."""
    by_id, _, _, _ = loaded
    pair = by_id["621"]
    assert pair.published == 89 * 384 / 2 == 17088
    assert pair.group == pair.table == "lambda-bert-squad" and pair.framework == "plain_pytorch"
    s = pair.setup
    assert (s.micro_batch_size, s.seq_len, s.gradient_accumulation_steps, s.num_gpus, s.strategy) == (28, 384, 1, 2, "ddp")
    # apex amp O2 (the log: cast_model_type torch.float16, patch_torch_functions False): an fp16 model, no autocast
    assert (s.weights_dtype, s.autocast, s.optimizer, s.gradient_checkpointing) == ("fp16", None, "adamw_torch_fused", False)
    assert s.attn_implementation == "eager" and s.lora is None and not s.torch_compile
    assert pair.hardware.smallest_gpu is not None and pair.hardware.smallest_gpu.name == "rtx3090"
    # BERT-large with a 1024 x 2 span head instead of the tied MLM head: the log's 335,150,082 weights, within 0.1%
    assert (pair.spec.head, pair.spec.num_labels) == ("question_answering", 2)
    assert pair.spec.total_params == pytest.approx(335_150_082, rel=1e-3)
    single = by_id["602"]    # the same card alone: 52 sequences/s
    assert single.published == 52 * 384 and single.setup.strategy == "single"


@pytest.mark.parametrize(("row", "gpu"), [("601", "v100-16gb"), ("603", "a10"), ("605", "a100-80gb-pcie"),
                                           ("606", "a100-80gb"), ("608", "a6000"), ("609", "rtx4090"),
                                           ("610", "h100-pcie"), ("612", "h100-80gb")])
def test_lambdas_part_names_map_to_the_named_parts(loaded, row: str, gpu: str) -> None:
    by_id, _, _, _ = loaded
    part = by_id[row].hardware.smallest_gpu
    assert part is not None and part.name == gpu


def test_parts_perfguide_does_not_name_are_listed_not_priced(loaded) -> None:
    """Quadro RTX 8000, the A100 40GB PCIe card (gpus.json has the 400 W SXM4 part only), RTX 6000 Ada x1/2/4/8."""
    by_id, why, _, _ = loaded
    listed = sorted(k for k in why if int(k) in LAMBDA)
    assert listed == ["600", "604", "607", "619", "633", "643"]
    assert all("not a perfguide named GPU" in why[k] for k in listed)
    assert len([k for k in by_id if int(k) in LAMBDA]) == 47


def test_the_new_part_needles_touch_no_other_source(rows: ModuleType, loaded) -> None:
    """The needles added for Lambda's part names match no row outside 600-652, so no other row's GPU changed."""
    _, _, _, every = loaded
    added = ("v100 16gb", "a100 80gb pcie", "h100 80gb pcie", "nvidia a10 24gb", *rows.UNNAMED_PARTS)
    for r in every:
        if int(r["row_id"]) not in LAMBDA:
            assert not any(n in r["gpu_type"].lower() for n in added), r["row_id"]
    assert {rows.group_of(r) for r in every if int(r["row_id"]) in LAMBDA} == {"lambda-bert-squad"}
    assert all(rows.group_of(r) != "lambda-bert-squad" for r in every if int(r["row_id"]) not in LAMBDA)


def test_only_these_rows_read_as_apex_o2(rows: ModuleType, loaded) -> None:
    """The apex O2 reading (fp16 weights, no autocast) is theirs alone; every other fp16 AMP row keeps autocast."""
    _, _, _, every = loaded
    o2 = [r["row_id"] for r in every if "apex amp o2" in r["precision"].lower()]
    assert sorted(o2, key=int) == [str(i) for i in LAMBDA]
    assert rows._precision({"precision": "fp16 AMP (apex amp O2: fp16 model weights)", "finetune": "yes"}) == {"weights_dtype": "fp16"}
    assert rows._precision({"precision": "fp16 AMP", "finetune": "yes"}) == {"weights_dtype": "fp32", "autocast": "fp16"}
