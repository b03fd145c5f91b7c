"""ArcticTraining's ALST recipes read on their authors' gauge, NVML used memory (bench/accuracy_gauge.py, issue 24's
max-context class, rows 2200-2228): the free block HF's loss leaves mapped, counted by hand and replayed through the
allocator, and which rows the reading applies to."""

from __future__ import annotations

from types import ModuleType

from helpers import load_bench, load_script

V = 128256   # Llama-3.1-8B-Instruct config.json vocab_size
MIB2 = 2 << 20


def _hf_loss_order(tokens: int) -> list[tuple[str, int, int]]:
    """transformers 4.51.3's LlamaForCausalLM + ForCausalLMLoss at batch 1, its large requests in order: the head's
    bf16 logits (1), the fp32 upcast (2), the fp32 log-softmax output (3); the model returns and ArcticTraining's
    ``loss()`` drops the output (1, 2 freed); backward: the nll gradient (4), the log-softmax input gradient (5); the
    log-softmax node releases its saved output and input gradient (3, 4); the bf16 gradient of the upcast (6)."""
    n = tokens * V
    return [("a", 1, 2 * n), ("a", 2, 4 * n), ("a", 3, 4 * n), ("f", 1, 0), ("f", 2, 0),
            ("a", 4, 4 * n), ("a", 5, 4 * n), ("f", 3, 0), ("f", 4, 0), ("a", 6, 2 * n), ("f", 5, 0), ("f", 6, 0)]


def test_hf_loss_leaves_the_16_bit_logits_mapped_beside_its_12_bytes() -> None:
    """By hand: the backward of the loss holds 4 + 4 + 4 = 12 B per logit and the mapped bytes peak at 14: the
    nll gradient takes the upcast's freed block, the input gradient (4) fits no freed block (the 16-bit logits' is
    2) and takes new memory. Replayed through the caching allocator (each request above 10 MiB its own segment
    rounded to 2 MiB; under expandable segments the two freed blocks are one 6 B hole, whose front the nll gradient
    takes, leaving the same 2 B)."""
    alloc = load_script("caching_allocator")
    a = alloc.Allocator()
    a.replay(_hf_loss_order(4096))
    n = 4096 * V
    assert a.peak_allocated == 12 * n                  # 2 B x n is a multiple of 2 MiB at 4,096 tokens: no rounding
    assert a.peak_reserved - a.peak_allocated == 2 * n  # the 16-bit head block, free and mapped


def test_the_block_is_the_16_bit_logits_and_none_under_liger(acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    gauge = load_bench("accuracy_gauge")
    spec = acc._spec(rows["2201"]["model_hf_id"])
    base, liger = acc._train_setup(rows["2201"], spec), acc._train_setup(rows["2205"], spec)
    assert gauge.mapped_free_block(spec, base) == 2 * 36000 * V   # 8.60 GiB at the recipe's length
    assert liger.liger_kernel and gauge.mapped_free_block(spec, liger) == 0


def test_only_the_recipes_that_ran_with_expandable_segments_are_gauged(rows: dict[str, dict[str, str]]) -> None:
    gauge = load_bench("accuracy_gauge")
    alst = [rows[str(i)] for i in range(2200, 2229)]
    assert all(gauge.gauged(r) for r in alst)
    planted = dict(rows["2201"], notes=rows["2201"]["notes"].replace("expandable_segments:True", ""))
    assert not gauge.gauged(planted)
    assert not any(gauge.gauged(r) for r in rows.values() if r["source_group"] != "arctictraining_alst_recipes")


def test_a_measured_nvml_row_and_a_recipe_length_read_on_the_gauge(acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    """Row 2200 (NV 71.91 GiB at 32,000 tokens) is compared at the fit footprint + context + the 16-bit logits block;
    row 2201 (36,000 tokens, 'close to oom') fits on the gauge at its length, longer ones stop where the gauge meets
    the card, and the row's note keeps the plan's own longest length, which leaves the block out."""
    row = rows["2200"]
    spec = acc._spec(row["model_hf_id"])
    setup = acc._train_setup(row, spec)
    est = acc._verdict_estimate(row, spec, setup, acc._hardware(row["gpu_type"], setup.num_gpus))
    got = acc.evaluate(row, [])
    assert abs(got.predicted * 2**30 - (est.fit_total + 2 * 32000 * V)) < 2**20
    ctx = acc.evaluate(rows["2201"], [])
    hw = acc._hardware(rows["2201"]["gpu_type"], 1)
    spec1 = acc._spec(rows["2201"]["model_hf_id"])
    s1 = acc._train_setup(rows["2201"], spec1)
    plan = acc.max_context(rows["2201"], spec1, s1, hw, False)
    assert ctx.verdict_ok and 36000 <= ctx.predicted < plan
    assert f"a plan on this card fits {plan:,} tokens" in ctx.note
    # the longest length on the gauge: the footprint plus the 16-bit block (2 B x s x V) meets the card there
    for s, fits in ((int(ctx.predicted), True), (int(ctx.predicted) + 32, False)):
        e = acc._verdict_estimate(rows["2201"], spec1, s1.replace(seq_len=s), hw)
        assert (e.fit_total + 2 * s * V <= e.capacity) is fits and e.fits


def test_h100_recipes_run_on_8_gpu_nodes_whose_host_ram_holds_every_published_length(
        acc: ModuleType, rows: dict[str, dict[str, str]]) -> None:
    """The README's machines ('H100 80GB nodes w/ 8 GPUs per node', '1.9TB CPU memory'): a multi-node recipe is
    8 processes on each of N / 8 nodes, and each node's offloaded states and checkpoints fit its RAM at every length
    that ran. The H200 recipes name no node RAM and are judged on the GPU only."""
    gauge = load_bench("accuracy_gauge")
    assert gauge.recipe_nodes(rows["2217"], 32) == {"num_gpus": 8, "nodes": 4}
    assert gauge.recipe_nodes(rows["2209"], 8) == {} and gauge.recipe_nodes(rows["2227"], 1) == {}
    assert not gauge.on_recipe_nodes(rows["2227"]) and gauge.on_recipe_nodes(rows["2202"])
    checked = 0
    for rid in (str(i) for i in range(2201, 2220) if i != 2216):   # 2216: 15.5M tokens, past Setup's bound
        row = rows[rid]
        if row["value_kind"] != "max_seq_fit" or not gauge.on_recipe_nodes(row):
            continue
        spec = acc._spec(row["model_hf_id"])
        setup = acc._train_setup(row, spec)
        est = acc._verdict_estimate(row, spec, setup, acc._hardware(row["gpu_type"], setup.num_gpus))
        assert gauge.host_ram_fits(row, est), (rid, est.cpu_ram / 2**30)
        checked += 1
    assert checked >= 15
