"""A one-GPU scenario on a machine with several GPUs, and the CLI's word 'none' for quantization.

A user with two 24 GB cards who keeps the default scenario is told first what the many-GPU scenario runs on those
two cards (70B QLoRA on two 24 GB cards, Answer.AI's fsdp_qlora recipe), not only a bigger card or four of them;
'--quantization none' reaches the plan as the constraint 'none' (the checkpoint as it is), never as 'unset', which
let perfguide quantize to nf4 after the user said not to.
"""

from __future__ import annotations

from perfguide import recommend
from perfguide.cli import build_parser
from perfguide.cli_recommend import _constraints_from_args


def test_two_consumer_cards_lead_with_the_many_gpu_plan_that_fits_on_them() -> None:
    one = recommend("meta-llama/Llama-3.1-70B", "train_gpu_one", hardware="rtx4090:2", finetune="qlora")
    many = recommend("meta-llama/Llama-3.1-70B", "train_gpu_many", hardware="rtx4090:2", finetune="qlora")
    # the 70B's nf4 weights alone (~35 GiB) exceed one 24 GB card; FSDP over both shards them
    assert not one.fits and many.fits
    lead = one.suggestions[0]
    assert lead.startswith("scenario='train_gpu_many', hardware='rtx4090:2' fits on the 2 GPUs you have")
    assert many.setup.label in lead and f"{many.throughput.step_time_s:.3g} s/step" in lead
    # said once: a suggestion, not also an 'idle GPUs' warning
    assert not any("sit idle" in w for w in one.warnings)


def test_a_one_gpu_serving_plan_names_the_idle_gpu_with_both_latencies() -> None:
    one = recommend("meta-llama/Llama-3.1-70B", "infer_gpu_one", hardware="a100-80gb:2")
    many = recommend("meta-llama/Llama-3.1-70B", "infer_gpu_many", hardware="a100-80gb:2")
    said = [w for w in one.warnings if "sit idle" in w]
    assert one.fits and said and "1 of the 2 GPUs" in said[0] and "scenario='infer_gpu_many'" in said[0]
    ms_many, ms_one = many.throughput.time_per_output_token_ms, one.throughput.time_per_output_token_ms
    assert ms_many is not None and ms_one is not None
    assert f"{ms_many:.3g} ms per output token against {ms_one:.3g} ms here" in said[0]
    assert not any("sit idle" in w for w in recommend("gpt2", "infer_gpu_one", hardware="a100-80gb").warnings)


def test_the_cli_word_none_is_the_quantization_constraint_not_unset() -> None:
    parser = build_parser()
    args = parser.parse_args(["recommend", "meta-llama/Llama-3.1-70B", "--scenario", "infer_gpu_one", "--quantization", "none"])
    assert _constraints_from_args(args)["quantization"] == "none"
    # a nullable field without 'none' among its values still reads the word as None
    args = parser.parse_args(["recommend", "gpt2", "--quantized-model", "none"])
    assert _constraints_from_args(args)["quantized_model"] is None


def test_quantization_none_keeps_16bit_weights_and_may_offload_them() -> None:
    # 70.6B params x 2 B = 141 GB of bf16 weights: one 80 GB card does not hold them, its nf4 weights (~37 GB) do,
    # so the unconstrained plan quantizes
    auto = recommend("meta-llama/Llama-3.1-70B", "infer_gpu_one", hardware="a100-80gb")
    kept = recommend("meta-llama/Llama-3.1-70B", "infer_gpu_one", hardware="a100-80gb", quantization="none")
    assert auto.fits and auto.setup.weights_dtype in ("int8", "nf4")
    # 'none' is honoured: the 16-bit checkpoint, streamed from CPU RAM (not quantized), is the only way it fits
    assert kept.setup.weights_dtype == "bf16"
    assert kept.fits and kept.setup.offload_params and kept.setup.strategy == "device_map"
    assert kept.memory.cpu_ram > 50 * 2**30
    # the many-GPU planner honours it the same way: 2 x 40 GB cards do not hold 70 GB of bf16 weights each
    many = recommend("meta-llama/Llama-3.1-70B", "infer_gpu_many", hardware="a100-40gb:2", quantization="none")
    assert many.setup.weights_dtype == "bf16" and many.fits and many.setup.offload_params


def test_a_kv_cache_too_small_for_one_sequence_offers_fp8_kv_priced_and_it_holds_when_followed() -> None:
    kw = {"hardware": "rtx4090", "engine": "vllm", "max_model_len": 131072}
    rec = recommend("meta-llama/Llama-3.1-8B", "infer_gpu_one", **kw)
    # Llama-3.1-8B: 32 layers x 8 KV heads x 128 x (K + V) x 2 B = 128 KiB per token in bf16; the pool left after the
    # weights holds fewer than 131,072 tokens
    assert not rec.fits and rec.memory.kv_cache_tokens < 131072
    (hint,) = [s for s in rec.suggestions if s.startswith("kv_cache_dtype='fp8' fits")]
    followed = recommend("meta-llama/Llama-3.1-8B", "infer_gpu_one", kv_cache_dtype="fp8", **kw)
    assert followed.fits and f"KV {followed.memory.kv_cache_tokens:,} tokens" in hint
    assert followed.memory.kv_cache_tokens >= 131072
    # a cache dtype the user named is theirs: no fp8 hint then, nor on a GPU without fp8 (Ampere)
    named = recommend("meta-llama/Llama-3.1-8B", "infer_gpu_one", kv_cache_dtype="auto", **kw)
    ampere = recommend("meta-llama/Llama-3.1-8B", "infer_gpu_one", **{**kw, "hardware": "a10g"})
    assert not any("kv_cache_dtype='fp8'" in s for s in (*named.suggestions, *ampere.suggestions))


def test_a_small_card_is_offered_fewer_concurrent_sequences_priced_and_it_holds_when_followed() -> None:
    """Qwen3-8B on an RTX 3060 under vLLM: at the plan's 256 sequences the start-up profile (the sampler over 256 rows of
    a 151,936-token vocabulary) leaves no room for one request in any format vLLM loads at start; fewer sequences do."""
    kw = {"hardware": "rtx3060", "engine": "vllm"}
    rec = recommend("Qwen/Qwen3-8B", "infer_gpu_one", **kw)
    assert not rec.fits
    (hint,) = [s for s in rec.suggestions if s.startswith("max_num_seqs=")]
    seqs = int(hint.split("=")[1].split()[0])
    followed = recommend("Qwen/Qwen3-8B", "infer_gpu_one", max_num_seqs=seqs, **kw)
    assert followed.fits and followed.setup.serving.max_num_seqs == seqs
    assert f"KV {followed.memory.kv_cache_tokens:,} tokens" in hint
    assert not recommend("Qwen/Qwen3-8B", "infer_gpu_one", max_num_seqs=2 * seqs, **kw).fits
    # a concurrency the user named is theirs: no such hint then
    assert not any(s.startswith("max_num_seqs=") for s in recommend("Qwen/Qwen3-8B", "infer_gpu_one", batch_size=256, **kw).suggestions)
