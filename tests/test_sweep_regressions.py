"""Defects bench/sweep.py found by running recommend() and its writers across real models, scenarios and targets.

Each test fails on the code before its fix; the expected values come from the libraries' own rules (accelerate's
FSDP2 upcast, TRL's SFTConfig defaults) or from arithmetic, never from perfguide's own output.
"""

from __future__ import annotations

import copy
import re

import pytest

import perfguide
from perfguide._base import GiB
from perfguide.scenarios.search import gib_over

try:  # tests/ as a plain folder or as a package
    from helpers import make_rec
except ImportError:  # pragma: no cover
    from tests.helpers import make_rec


# --- a forced micro-batch and the "what would fit" search -------------------------------------------------------------

def test_forced_micro_batch_survives_the_smaller_global_batch_suggestion() -> None:
    """micro_batch_size=2 divides the default global batch 32; a 14B full fine-tune does not fit one 3090, and the
    suggestion search halved the global batch down to 1, where 2 no longer divides it: the user saw
    'micro_batch_size=2 does not divide the per-device batch 1' for a constraint that was valid."""
    rec = perfguide.recommend("Qwen/Qwen2.5-14B", "train_gpu_one", hardware="rtx3090", micro_batch_size=2)
    assert rec.setup.micro_batch_size == 2 and rec.setup.micro_batch_size * rec.setup.gradient_accumulation_steps == 32
    assert not rec.fits
    for line in rec.suggestions:   # any smaller global batch offered must still be one the forced micro-batch divides
        for k in re.findall(r"global_batch_size=(\d+)", line):
            assert int(k) % 2 == 0, line


# --- SFTConfig's explicit switches agree with TrainingArguments' -----------------------------------------------------

def _sft_and_args(setup: dict) -> tuple[dict, dict]:
    rec = make_rec(setup)
    return rec.sft_config_dict(), rec.training_args_dict()


def test_sft_config_keeps_pure_bf16_fsdp_out_of_mixed_precision() -> None:
    """Pure bf16 under FSDP2: accelerate's fsdp2_prepare_model upcasts trainable bf16 params to fp32 whenever mixed
    precision is on, so the Trainer's bf16 switch must stay off (TrainingArguments does). SFTConfig's bf16 defaults
    to True, and the SFT kwargs set it from the autocast (bf16) again: a run with fp32 masters, twice the bytes priced."""
    setup = {"weights_dtype": "bf16", "autocast": "bf16", "strategy": "fsdp", "num_gpus": 8, "optimizer": "adamw_torch"}
    sft, args = _sft_and_args(setup)
    assert args.get("bf16", False) is False
    assert sft["bf16"] is False and sft["fp16"] is False
    assert make_rec(setup).accelerate_config()["mixed_precision"] == "no"


def test_sft_config_keeps_the_bf16_switch_of_an_fp8_plan() -> None:
    """fp8 through accelerate keeps the Trainer's own switch at bf16 (the ops left out of fp8 run in bf16); the SFT
    kwargs wrote bf16=False for it, so every non-fp8 op of the SFT run ran in fp32."""
    sft, args = _sft_and_args({"weights_dtype": "fp32", "autocast": "fp8", "num_gpus": 1})
    assert args["bf16"] is True
    assert sft["bf16"] is True


def test_sft_config_object_keeps_the_switches(tmp_path) -> None:
    """Through trl's own SFTConfig (its bf16 default is True): the pure-bf16 FSDP plan's bf16 stays off."""
    trl = pytest.importorskip("trl")
    sft, _ = _sft_and_args({"weights_dtype": "bf16", "autocast": "bf16", "strategy": "fsdp", "num_gpus": 8, "optimizer": "adamw_torch"})
    kw = {k: v for k, v in copy.deepcopy(sft).items() if k not in ("tf32", "ddp_backend")}
    cfg = trl.SFTConfig(**{**kw, "output_dir": str(tmp_path), "use_cpu": True})
    assert cfg.bf16 is False


# --- "needs A > B usable" reads true at the precision printed ---------------------------------------------------------

@pytest.mark.parametrize("need, usable", [(71.25, 71.23), (21.31, 21.29), (10.0004, 10.0), (5.06, 4.95)])
def test_gib_over_prints_a_true_comparison(need: float, usable: float) -> None:
    """At one decimal 71.25 GiB and 71.23 GiB both print 71.2: 'needs 71.2 GiB > 71.2 GiB usable' is a false
    statement about the numbers shown. The printed pair must compare as the bytes do."""
    text = gib_over(need * GiB, usable * GiB)
    a, b = re.findall(r"([\d,.]+) (?:GiB|B)", text)
    assert float(a.replace(",", "")) > float(b.replace(",", "")), text


# --- serving engines plan token generation over a decoder's KV cache -------------------------------------------------

@pytest.mark.parametrize("model, engine", [("google-t5/t5-base", "vllm"), ("google-t5/t5-base", "sglang"),
                                           ("google-bert/bert-base-uncased", "vllm"), ("google-bert/bert-base-uncased", "sglang")])
def test_a_server_engine_refuses_models_it_cannot_time_per_output_token(model: str, engine: str) -> None:
    """vLLM never served T5 (vllm-project/vllm#187) and dropped encoder-decoders in V1 (#31004); BERT's masked-LM
    head emits no tokens. Both were planned as 'batch 256/replica' with a time per output token (BERT: 23 ms on a
    T4), and the serve command would fail at start-up or do something else than priced."""
    with pytest.raises(perfguide.PerfGuideError) as err:
        perfguide.recommend(model, "infer_gpu_one", hardware="a10g", engine=engine)
    assert "\n" not in str(err.value) and "engine='transformers'" in str(err.value)


@pytest.mark.parametrize("model", ["google-t5/t5-base", "google-bert/bert-base-uncased"])
def test_the_in_script_plan_points_no_encoder_at_a_server(model: str) -> None:
    """The transformers plan's engine hint told BERT and T5 users to 'pass engine=vllm' for more tokens/s."""
    rec = perfguide.recommend(model, "infer_gpu_one", hardware="a10g")
    assert rec.fits
    hint = rec.decision("engine")
    assert hint is None or all(a.value not in ("vllm", "sglang") for a in hint.alternatives)


def test_decoder_lms_keep_the_server_hint() -> None:
    rec = perfguide.recommend("openai-community/gpt2", "infer_gpu_one", hardware="a10g")
    assert [a.value for a in rec.decision("engine").alternatives] == ["vllm"]


# --- warnings that contradict their own numbers or the plan ------------------------------------------------------------

def test_host_ram_warning_headroom_figure_is_not_below_the_need() -> None:
    """'offloaded states need 0.4 GiB of it (0 GiB with the headroom)': need / (1 - headroom) was printed at no
    decimals, so the figure with the headroom read smaller than the need itself. Activation offloading is forced so
    the plan keeps states in host RAM whatever the cost model's latest pick (a 1B on a 3090 needs none since stop 36)."""
    rec = perfguide.recommend("meta-llama/Llama-3.2-1B", "train_gpu_one", hardware="rtx3090", activation_offloading=True)
    lines = [w for w in rec.warnings if "with the headroom" in w and "of it (" in w]
    assert lines, rec.warnings
    for w in lines:
        need, with_headroom = (float(x) for x in re.search(r"need ([\d.]+) GiB of it \(([\d.]+) GiB with the headroom", w).groups())
        assert with_headroom >= need and with_headroom == pytest.approx(need / (1 - rec.request.constraints.headroom), abs=0.06), w


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3"])
def test_deepspeed_warning_speaks_of_zero3_loading_only_for_zero3(strategy: str) -> None:
    """A ZeRO-1 plan was told 'so ZeRO-3 partitions the weights while loading'; only stage 3 partitions weights."""
    rec = perfguide.recommend("meta-llama/Llama-3.2-1B", "train_gpu_many", hardware="a100-80gb:8", strategy=strategy)
    assert rec.setup.strategy == strategy
    ds = [w for w in rec.warnings if w.startswith("DeepSpeed:")]
    assert len(ds) == 1
    assert ("ZeRO-3" in ds[0]) == (strategy == "zero3"), ds[0]


# --- a forced serving concurrency the engine cannot hold is said --------------------------------------------------------

def test_forced_batch_size_above_the_kv_cache_is_said() -> None:
    """batch_size=32 for Llama-3.1-8B on one 4090 under vLLM: the plan priced 31 per replica and said only 'fits'.
    The KV-cache arithmetic: kv_cache_tokens // (prompt + new tokens) sequences run at once."""
    rec = perfguide.recommend("meta-llama/Llama-3.1-8B", "infer_gpu_one", hardware="rtx4090", engine="vllm", batch_size=32)
    s = rec.setup.serving
    assert s is not None and rec.kv_cache_tokens is not None
    holds = rec.kv_cache_tokens // (1024 + 256)
    running = rec.setup.micro_batch_size * s.data_parallel_size
    assert running == min(32, holds)
    said = [w for w in rec.warnings if w.startswith("batch_size=32 asked")]
    assert (running < 32) == bool(said), rec.warnings
    if said:
        assert f"{running} run at once" in said[0]


def test_forced_batch_size_capped_by_max_num_seqs_names_that_knob() -> None:
    rec = perfguide.recommend("meta-llama/Llama-3.1-8B", "infer_gpu_one", hardware="rtx4090", engine="vllm", batch_size=64, max_num_seqs=16)
    said = [w for w in rec.warnings if w.startswith("batch_size=64 asked")]
    assert rec.setup.micro_batch_size == 16 and len(said) == 1 and "raise max_num_seqs" in said[0]


def test_vllm_serves_gpt_oss_mxfp4_on_mi300x() -> None:
    """vLLM's gpt-oss announcement (https://blog.vllm.ai/2025/08/05/gpt-oss.html) lists AMD MI300x and MI355x among the
    GPUs it serves gpt-oss on; the format table refused MXFP4 on AMD ('does not run on mi300x'). The 120b is 63 GB in
    MXFP4 (same post), well inside one MI300X's 192 GB."""
    rec = perfguide.recommend("openai/gpt-oss-120b", "infer_gpu_one", hardware="mi300x", engine="vllm")
    assert rec.fits and rec.setup.serving is not None and rec.setup.serving.weight_format == "mxfp4"


# --- the hub ids recipes name resolve offline -------------------------------------------------------------------------

def test_llama_3_3_70b_instruct_resolves_offline_with_its_published_shape() -> None:
    """vLLM and fine-tuning recipes of 2025 name meta-llama/Llama-3.3-70B-Instruct; offline it was 'not in the catalog'.
    Its config.json is Llama-3.1-70B's shape; the count by hand from that shape: untied embedding + head
    2 x 128256 x 8192, per layer q/o 8192^2 each, k/v 8192 x 1024 each, SwiGLU 3 x 8192 x 28672, two RMSNorms."""
    spec = perfguide.ModelSpec.from_any("meta-llama/Llama-3.3-70B-Instruct")
    h, kv, ffn, layers, vocab = 8192, 1024, 28672, 80, 128256
    by_hand = 2 * vocab * h + layers * (2 * h * h + 2 * h * kv + 3 * h * ffn + 2 * h) + h
    assert spec.name == "meta-llama/Llama-3.3-70B-Instruct" and spec.total_params == by_hand
    assert spec.max_position_embeddings == 131072


def test_gemma_3_1b_it_resolves_like_the_other_gemma_3_it_names() -> None:
    """Offline, the -it checkpoint takes the -pt entry's shape; it keeps its own id (the one a script must load)."""
    it, pt = (perfguide.ModelSpec.from_any(f"google/gemma-3-1b-{v}") for v in ("it", "pt"))
    assert it.model_dump(exclude={"name", "config"}) == pt.model_dump(exclude={"name", "config"})
    assert (it.name, pt.name) == ("google/gemma-3-1b-it", "google/gemma-3-1b-pt")


# --- a suggestion, followed, holds -----------------------------------------------------------------------------------------

def _followed(suggestion: str, model: str) -> perfguide.Recommendation:
    """Run exactly what a suggestion names: its hardware= and scenario=."""
    hw = re.search(r"hardware='([^']+)'", suggestion)
    sc = re.search(r"scenario='([^']+)'", suggestion)
    assert hw and sc, suggestion
    return perfguide.recommend(model, sc.group(1), hardware=hw.group(1))


@pytest.mark.parametrize("model, hardware", [("Qwen/Qwen3-8B", "t4"), ("microsoft/phi-4", "rtx3090")])
def test_sharded_suggestion_names_a_target_that_parses_and_fits(model: str, hardware: str) -> None:
    """'32 x t4 with FSDP full sharding (scenario='train_gpu_many')': the obvious hardware='t4:32' is refused (no node
    holds 32 GPUs); the suggestion now names the nodes it was priced on, and that plan fits."""
    rec = perfguide.recommend(model, "train_gpu_one", hardware=hardware)
    sharded = [s for s in rec.suggestions if "FSDP full sharding" in s]
    assert len(sharded) == 1 and "hardware=" in sharded[0], rec.suggestions
    assert _followed(sharded[0], model).fits


@pytest.mark.parametrize("model, hardware", [("Qwen/Qwen2.5-72B", "a10g"), ("openai/gpt-oss-20b", "t4"), ("deepseek-ai/DeepSeek-V3", "a100-80gb:8")])
def test_infer_suggestions_of_more_gpus_hold(model: str, hardware: str) -> None:
    """'several GPUs: scenario='infer_gpu_many' splits the weights' was offered for DeepSeek-V3 on 8 x A100, where
    infer_gpu_many does not fit either; the suggestion is now a priced target, offered only when it fits."""
    rec = perfguide.recommend(model, "infer_gpu_one", hardware=hardware)
    assert not rec.fits
    for s in rec.suggestions:
        if "infer_gpu_many" in s:
            assert _followed(s, model).fits, s
    if model.startswith("deepseek"):
        assert not any("infer_gpu_many" in s for s in rec.suggestions)


@pytest.mark.parametrize("model, scenario", [("Qwen/Qwen3-32B", "train_cpu"), ("Qwen/Qwen3-30B-A3B", "train_cpu"),
                                             ("deepseek-ai/DeepSeek-V3", "infer_cpu")])
def test_cpu_plans_gpu_hint_says_what_one_a100_holds(model: str, scenario: str) -> None:
    """'a GPU plan: scenario='train_gpu_one' with hardware='a100-80gb'' was said for models one A100-80GB cannot hold;
    the hint now carries that plan's own verdict."""
    rec = perfguide.recommend(model, scenario, hardware="cpu")
    hint = [s for s in rec.suggestions if s.startswith("a GPU plan")]
    assert len(hint) == 1
    gpu_scenario = scenario.replace("cpu", "gpu_one")
    on_a100 = perfguide.recommend(model, gpu_scenario, hardware="a100-80gb")
    assert ("does not hold it either" in hint[0]) == (not on_a100.fits), hint[0]
    assert ("hardware='a100-80gb' fits" in hint[0]) == on_a100.fits, hint[0]


# --- decisions carry their deciding number -------------------------------------------------------------------------------

def test_attention_tf32_cache_and_quantization_decisions_carry_their_number() -> None:
    """The project's rule: every recommendation carries its reason, the deciding number and a source. 3,230 of 16,695
    decisions in bench/sweep.py had no number; these four kinds were most of them."""
    spec = perfguide.ModelSpec.from_any("meta-llama/Llama-3.1-8B")
    train = perfguide.recommend("meta-llama/Llama-3.1-8B", "train_gpu_one", hardware="t4", finetune="qlora", seq_len=2048)
    attn = train.decision("attn_implementation")
    # eager's scores: heads x s x s per sample and layer, 2 bytes in fp16 autocast
    assert attn.number == spec.num_attention_heads * 2048 * 2048 * 2 and "bytes" in attn.unit
    tf32 = train.decision("tf32")
    assert tf32.value is False and tf32.number == 7.5   # T4: compute capability 7.5 (NVIDIA's CUDA GPU list); TF32 needs 8.0
    serve = perfguide.recommend("meta-llama/Llama-3.1-8B", "infer_gpu_one", hardware="a10g")
    cache = serve.decision("cache_implementation")
    assert cache.value == "dynamic" and cache.number == serve.throughput.time_per_output_token_ms
    quant = serve.decision("quantization_config")
    assert quant.value is None and quant.number == pytest.approx(2 * spec.total_params, rel=0.01)   # bf16 weights, 2 B each


def test_a_named_serving_engine_decision_carries_the_predicted_rate() -> None:
    rec = perfguide.recommend("meta-llama/Llama-3.1-8B", "infer_gpu_one", hardware="a10g", engine="vllm")
    d = rec.decision("engine")
    assert d.number == rec.throughput.tokens_per_s > 0 and "tokens/s" in d.unit


@pytest.mark.parametrize("constraints", [{"batch_size": 8}, {"prefer": "latency"}])
def test_inference_batch_decision_names_its_source(constraints: dict) -> None:
    """The one kind of decision bench/sweep.py found without a source (40 of 16,695): a requested or latency batch."""
    rec = perfguide.recommend("meta-llama/Llama-3.2-1B", "infer_gpu_one", hardware="l4", **constraints)
    d = rec.decision("batch_size")
    assert d.source and d.number is not None


def test_a_serving_plan_that_does_not_fit_marks_no_candidate_chosen() -> None:
    """gemma-2-9b on one L4 at batch 64 did not fit, and its candidates table still marked the offloaded layout
    'chosen' beside the headline's DOES NOT FIT."""
    rec = perfguide.recommend("google/gemma-2-9b", "infer_gpu_one", hardware="l4", batch_size=64, prefer="latency")
    assert not rec.fits
    assert not [c for c in rec.candidates if c.verdict == "chosen"]
    ok = perfguide.recommend("google/gemma-2-9b", "infer_gpu_one", hardware="l4")
    assert ok.fits and len([c for c in ok.candidates if c.verdict == "chosen"]) == 1


def test_offload_max_memory_decision_names_its_source() -> None:
    """The last decision kind without a source in the sweep: device_map offload's max_memory budget."""
    rec = perfguide.recommend("Qwen/Qwen3-8B", "infer_gpu_one", hardware="l4", batch_size=64, prefer="latency")
    d = rec.decision("max_memory")
    assert d is not None and d.source and "big_modeling" in d.source


def test_estimate_and_check_refuse_an_encoder_on_a_server_engine_as_recommend_does() -> None:
    """estimate() of a serving setup and `perfguide check` of a serve command priced T5 / BERT on vLLM as decoders."""
    with pytest.raises(perfguide.PerfGuideError, match="engine='transformers'"):
        perfguide.estimate("google-t5/t5-base", {"task": "infer", "serving": {"engine": "vllm"}}, hardware="a10g")
    with pytest.raises(perfguide.PerfGuideError, match="generates no tokens"):
        perfguide.check("google-bert/bert-base-uncased", "vllm serve google-bert/bert-base-uncased", hardware="a10g")
    ok = perfguide.check("openai-community/gpt2", "vllm serve openai-community/gpt2", hardware="a10g")
    assert ok.fits
