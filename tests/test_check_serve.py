"""perfguide check -- vllm serve / python -m sglang.launch_server: the engine's flags read into a serving setup,
priced as ``perfguide.estimate`` prices it, and changes written back as flags the pinned parsers register
(tests/data/engine_flags.json, extracted from the vLLM 0.33 / SGLang 0.5.23 wheels by scripts/engine_flags.py)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

import perfguide
from perfguide.cli import main

FLAGS = json.loads((Path(__file__).parent / "data" / "engine_flags.json").read_text())
MODEL = "meta-llama/Llama-3.1-8B"
# Llama-3.1-8B config.json: 32 layers, 8 KV heads of dim 128; K and V in bf16 -> 2 * 32 * 8 * 128 * 2 bytes per token
KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def flags_of(command: str) -> list[str]:
    return [w.split("=")[0] for w in shlex.split(command) if w.startswith("-") and w not in ("-m",)]


def value(check: perfguide.Check, field: str) -> object:
    return next(s.value for s in check.read if s.field == field)


def test_vllm_command_read_flag_by_flag_and_priced_as_estimate() -> None:
    command = (f"vllm serve {MODEL} --tensor-parallel-size 2 --gpu-memory-utilization 0.85 --max-model-len 32768 --max-num-seqs 128 "
               "--kv-cache-dtype fp8 --dtype bfloat16 --quantization fp8 --enable-expert-parallel --served-model-name llama")
    assert set(flags_of(command)) <= set(FLAGS["vllm"]["flags"])
    assert "--max-model-length" not in FLAGS["vllm"]["flags"]
    c = perfguide.check(config=command + " --max-model-length 4096", hardware="h100-80gb:2")
    s = c.setup.serving
    assert s is not None and s.engine == "vllm"
    assert (s.tensor_parallel_size, s.gpu_memory_utilization, s.max_model_len, s.max_num_seqs) == (2, 0.85, 32768, 128)
    assert (s.kv_cache_dtype, s.dtype, s.weight_format, s.enable_expert_parallel) == ("fp8", "bf16", "fp8", True)
    assert c.setup.num_gpus == 2 and value(c, "serving.max_model_len") == 32768
    assert c.ignored == ("vLLM flags: --served-model-name",)
    assert len(c.unknown) == 1 and "--max-model-length" in c.unknown[0] and "--max-model-len" in c.unknown[0].split("(")[1]
    est = perfguide.estimate(MODEL, c.setup, hardware="h100-80gb:2")
    assert c.fits == est.fits and c.memory.kv_cache_tokens == est.kv_cache_tokens and c.memory.max_concurrency == est.max_concurrency


def test_sglang_command_read_flag_by_flag() -> None:
    command = (f"python -m sglang.launch_server --model-path {MODEL} --tp-size 2 --mem-fraction-static 0.8 --context-length 8192 "
               "--max-running-requests 64 --kv-cache-dtype fp8_e4m3 --dtype float16 --host 0.0.0.0 --port 30000")
    assert set(flags_of(command)) <= set(FLAGS["sglang"]["flags"])
    c = perfguide.check(config=command, hardware="h100-80gb:2")
    s = c.setup.serving
    assert s is not None and s.engine == "sglang"
    assert (s.tensor_parallel_size, s.gpu_memory_utilization, s.max_model_len, s.max_num_seqs, s.kv_cache_dtype, s.dtype) == (
        2, 0.8, 8192, 64, "fp8", "fp16")
    assert c.ignored == ("SGLang flags: --host", "SGLang flags: --port") and not c.unknown
    assert c.fits and c.memory.kv_cache_tokens == perfguide.estimate(MODEL, c.setup, hardware="h100-80gb:2").kv_cache_tokens


def test_speed_is_bounded_by_reading_the_weights_once_per_token() -> None:
    c = perfguide.check(config=f"vllm serve {MODEL} --max-model-len 8192", hardware="h100-80gb")
    t = c.throughput
    assert t is not None and t.time_per_output_token_ms is not None and c.setup.micro_batch_size >= 1
    # decode reads every weight once per step: at H100 SXM's 3.35 TB/s (NVIDIA datasheet) 16 GB takes >= 4.8 ms
    assert t.time_per_output_token_ms >= c.memory.weights / 3.35e12 * 1000
    assert t.tokens_per_s <= c.setup.micro_batch_size * 1000 / t.time_per_output_token_ms * 1.001
    assert perfguide.check(config=f"vllm serve {MODEL} --max-model-len 131072", hardware="l4").throughput is None


def test_kv_tokens_match_the_hand_derived_bytes_per_token() -> None:
    c = perfguide.check(config=f"vllm serve {MODEL} --max-model-len 8192", hardware="a100-80gb")
    assert c.fits and c.memory.kv_cache_tokens is not None
    # vLLM logs max_concurrency x max_model_len, whole blocks of 16: within one request of the bytes / per-token bytes
    assert abs(c.memory.kv_cache_tokens - c.memory.kv_cache / KV_BYTES_PER_TOKEN) <= 8192 + 16


def test_a_quantized_checkpoint_is_priced_in_its_own_format() -> None:
    # openai/gpt-oss-20b ships MXFP4 experts (config.json quantization_config quant_method=mxfp4); OpenAI's model card:
    # "gpt-oss-20b ... can run within 16GB of memory" (https://openai.com/index/introducing-gpt-oss/), vs ~42 GB in 16-bit
    c = perfguide.check(config="vllm serve openai/gpt-oss-20b --max-model-len 8192", hardware="h100-80gb")
    s = c.setup.serving
    assert s is not None and (s.weight_format, s.checkpoint_format) == ("mxfp4", "mxfp4")
    assert 10 * 2**30 < c.memory.weights < 16 * 2**30 and c.fits


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("hardware", "command"), [
    ("l4", f"vllm serve {MODEL} --max-model-len 131072"),                                          # the KV cache is too small
    ("h100-80gb:4", "vllm serve meta-llama/Llama-3.1-70B --max-model-len 8192"),                     # 141 GB of weights on one GPU
    ("h100-80gb:4", "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-70B --context-length 8192"),
])
def test_a_command_that_cannot_start_exits_3_and_its_change_exits_0(hardware: str, command: str,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    words = shlex.split(command)
    code, out, _ = run(["check", "--hardware", hardware, "--", *words], capsys)
    assert code == 3 and "does NOT fit" in out
    c = perfguide.check(config=command, hardware=hardware)
    change = c.change("fit")
    assert change is not None and change.fits and change.edits
    keys = change.edits[0].keys
    engine = c.setup.serving.engine  # type: ignore[union-attr]
    assert set(keys) <= set(FLAGS[engine]["flags"])
    fixed = [*words, *(w for k, v in keys.items() for w in (k, str(v)))]
    code, out, err = run(["check", "--hardware", hardware, "--", *fixed], capsys)
    assert code == 0 and "verdict: fits" in out, out + err


@pytest.mark.parametrize("command", [
    f"vllm serve {MODEL} --max-model-len abc",
    f"vllm serve {MODEL} --kv-cache-dtype fp9",
    "vllm serve --max-model-len 4096",
    f"python -m sglang.launch_server --model-path {MODEL} stray",
    f"vllm serve {MODEL} --gpu-memory-utilization 1.5",
    f"vllm serve {MODEL} --dtype float32",                        # valid for vLLM, refused by name: fp32 serving is not priced
])
def test_a_malformed_command_exits_2_in_one_line(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["check", "--hardware", "h100-80gb", "--", *shlex.split(command)], capsys)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err


def test_overrides_are_refused_for_a_serve_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["check", "--hardware", "h100-80gb", "--seq-len", "4096", "--", "vllm", "serve", MODEL], capsys)
    assert code == 2 and "own flags" in err


# Llama-3.1-8B config.json: 32 layers of q/o 4096x4096, k/v 4096x1024, gate/up/down 4096x14336; embed and untied lm_head 128256x4096
LINEARS_8B = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
EMBED_8B = 128256 * 4096


@pytest.mark.parametrize(("command", "engine", "load_extra"), [
    # vLLM counts allocated bytes: the weights and the rotary buffer (131072 positions x 128 dims, fp16)
    (f"vllm serve {MODEL} --quantization awq --dtype half --pipeline-parallel-size 2", "vllm", 131072 * 128 * 2),
    # SGLang counts the fall in free memory: its fp32 rotary table, and the caching allocator's rounding: of a stage's
    # 16 layers only o_proj's 4096 x 4096 / 2 = 8 MiB packs badly (two to a 20 MiB segment, 4 MiB left in each of 8);
    # qkv 12 MiB, gate_up 56 MiB, down 28 MiB, the 1002 MiB embedding and the 64 MiB table are whole 2 MiB multiples
    (f"python -m sglang.launch_server --model-path {MODEL} --quantization awq --dtype half --pp-size 2", "sglang",
     131072 * 128 * 4 + 8 * 4 * 2**20),
])
def test_other_words_of_the_parsers_are_read_and_priced(command: str, engine: str, load_extra: int) -> None:
    # vLLM QuantizationMethods and SGLang QUANTIZATION_CHOICES both register 'awq'; both parsers take --dtype half
    assert {"awq", "gptq"} <= set(FLAGS[engine]["quantization"])
    assert set(flags_of(command)) <= set(FLAGS[engine]["flags"])
    c = perfguide.check(config=command, hardware="l4:2")
    s = c.setup.serving
    assert s is not None and (s.weight_format, s.dtype, s.pipeline_parallel_size) == ("awq", "fp16", 2)
    # AWQ: 4 bits a weight plus one fp16 scale and one 4-bit zero per group of 128 -> 0.5 + 2.5/128 bytes; embed,
    # lm_head and the 65 RMSNorm vectors stay 16-bit; two pipeline stages hold half of everything but the norms each
    awq = LINEARS_8B * (0.5 + 2.5 / 128) + 2 * EMBED_8B * 2
    assert c.memory.weights == pytest.approx(awq / 2 + 65 * 4096 * 2 + load_extra, rel=1e-3)
    assert "serving.weight_format" in {r.field for r in c.read if "--quantization" in r.source}
    # a 16-bit repository named with AWQ kernels does not load: the reading says so beside the price
    assert any("pre-quantized checkpoint" in n and "refuses it at load" in n for n in c.notes)


# --- SGLang on small GPUs and its expert-parallel size (arg_groups/memory_hook.py, fused_moe_triton's moe_tp_size) -------

LLAMA8_BF16 = 8_030_261_248 * 2          # Llama-3.1-8B's parameters, 2 bytes each


def test_sglang_takes_its_own_chunk_and_fraction_on_a_24gb_gpu() -> None:
    # memory_hook.py: a GPU under 35 GB gets chunked_prefill_size 4096 and decode graphs to batch 48 (tp < 4), so the
    # default fraction reserves 512 + 4096 x 1.5 + 1024 / 8 + 48 x 2 = 6880 MB of the L4's 23034 MiB
    r = perfguide.recommend(MODEL, scenario="infer_gpu_one", hardware="l4", engine="sglang", quantization="none")
    s = r.setup.serving
    assert s is not None and r.fits and s.weight_format == "bf16" and s.max_num_batched_tokens == 4096
    assert s.gpu_memory_utilization >= round((23034 - 6880) / 23034, 3)
    assert "--chunked-prefill-size 4096" in r.serve_command() and set(flags_of(r.serve_command())) <= set(FLAGS["sglang"]["flags"])


def test_sglang_fraction_is_raised_to_hold_the_weights_or_the_plan_refused() -> None:
    r = perfguide.recommend(MODEL, scenario="infer_gpu_one", hardware="l4", engine="sglang", quantization="none", prompt_len=30000)
    s, m = r.setup.serving, r.engine_memory
    assert s is not None and m is not None and r.fits
    # the pool must hold the weights and one 30256-token request: (W + 131072 B a token x 30256) of what CUDA leaves
    need = (LLAMA8_BF16 + KV_BYTES_PER_TOKEN * s.max_model_len) / (m.total - m.cuda_context)
    assert s.gpu_memory_utilization == pytest.approx(-(-need * 100 // 1) / 100) and s.gpu_memory_utilization > 0.701
    assert any("raised from SGLang's default 0.701" in w for w in r.warnings)
    big = perfguide.recommend(MODEL, scenario="infer_gpu_one", hardware="l4", engine="sglang", quantization="none", prompt_len=100000)
    assert not big.fits and len(big.suggestions) == 1 and "\n" not in big.suggestions[0]


def test_sglang_ep_size_is_priced_as_tp_or_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    base = "python -m sglang.launch_server --model-path Qwen/Qwen3-30B-A3B --tp-size 4 --context-length 8192"
    assert {"--ep-size", "--tp-size"} <= set(FLAGS["sglang"]["flags"])
    plain, split = perfguide.check(config=base, hardware="l40s:4"), perfguide.check(config=base + " --ep-size 4", hardware="l40s:4")
    # moe_tp_size = tp // ep and experts per rank = E // ep: 1/4 of the expert bytes per GPU either way
    assert split.memory.weights == plain.memory.weights and any("--ep-size 4" in n for n in split.notes) and not split.unknown
    code, _, err = run(["check", "--hardware", "l40s:4", "--", *shlex.split(base + " --ep-size 3")], capsys)
    assert code == 2 and err.count("\n") == 1 and "tp_size % ep_size" in err
    with pytest.raises(perfguide.ConflictingConstraintsError, match="--ep-size"):
        perfguide.recommend("Qwen/Qwen3-30B-A3B", scenario="infer_gpu_many", hardware="l40s:4", engine="sglang", enable_expert_parallel=True)


def test_a_multi_node_pipeline_command_is_priced_per_stage() -> None:
    command = ("vllm serve meta-llama/Llama-3.1-405B --tensor-parallel-size 8 --pipeline-parallel-size 2 --max-model-len 8192 "
               "--nnodes 2 --node-rank 0 --master-addr 10.0.0.1")
    assert set(flags_of(command)) <= set(FLAGS["vllm"]["flags"])
    c = perfguide.check(config=command, hardware="h100-80gb:8x2")
    assert c.fits and (c.setup.num_gpus, c.setup.nodes) == (8, 2) and "16 GPUs" in c.hardware and not c.unknown
    # 405.85 B bf16 parameters over TP8 x PP2; each stage keeps 63 of the 126 layers' KV: 63 x 2 x (8 / 8) x 128 x 2 B a token
    assert c.memory.weights == pytest.approx(405_853_388_800 * 2 / 16, rel=0.01)
    assert c.memory.kv_cache / c.memory.kv_cache_tokens == pytest.approx(63 * 2 * 1 * 128 * 2, rel=0.01)
    assert perfguide.estimate("meta-llama/Llama-3.1-405B", c.setup, hardware="h100-80gb:8x2").kv_cache_tokens == c.memory.kv_cache_tokens


@pytest.mark.parametrize("hardware, seqs, tokens", [("rtx4090", 256, 2048), ("a100-80gb", 256, 2048), ("h100-80gb", 1024, 8192)])
def test_vllm_batching_the_command_leaves_out_is_vllms_own_default_on_that_gpu(hardware: str, seqs: int, tokens: int) -> None:
    """vllm/engine/arg_utils.py get_batch_defaults for ``vllm serve``: 1024 sequences and 8192 batched tokens on a GPU
    of 70 GiB or more that is not an A100, else 256 and 2048. The check used perfguide's 256 / 8192 everywhere, so it
    priced a small card's profile run at four times the prefill chunk vLLM runs there."""
    bare = perfguide.check(config=f"vllm serve {MODEL} --max-model-len 8192", hardware=hardware)
    assert (value(bare, "serving.max_num_seqs"), value(bare, "serving.max_num_batched_tokens")) == (seqs, tokens)
    assert all("vLLM's own default" in s.source for s in bare.read if s.field in ("serving.max_num_seqs", "serving.max_num_batched_tokens"))
    said = perfguide.check(config=f"vllm serve {MODEL} --max-model-len 8192 --max-num-seqs 64 --max-num-batched-tokens 4096",
                           hardware=hardware)
    assert (value(said, "serving.max_num_seqs"), value(said, "serving.max_num_batched_tokens")) == (64, 4096)


def test_sglang_default_memory_fraction_reserves_by_its_own_chunk_size() -> None:
    """SGLang's default mem_fraction_static reserves 1.5 MB per chunked-prefill token, and on an L4 (23,034 MiB) its
    chunk is 4,096 tokens. The check computed the fraction before filling in the chunk, with perfguide's 8,192:
    0.435 where SGLang takes (23034 - 512 - 4096 x 1.5 - 1024 / 8 - 48 x 2) / 23034 = 0.701."""
    c = perfguide.check(config=f"python -m sglang.launch_server --model-path {MODEL} --context-length 8192", hardware="l4")
    assert value(c, "serving.max_num_batched_tokens") == 4096
    assert value(c, "serving.gpu_memory_utilization") == round((23034 - 512 - 4096 * 1.5 - 1024 / 8 - 48 * 2) / 23034, 3)


def test_a_small_card_is_offered_fewer_sequences_where_the_sampler_profile_is_what_overflows() -> None:
    """Qwen3-8B in fp8 on an RTX 3060 (11.75 GiB): vLLM profiles its sampler over max_num_seqs rows of the 151,936-token
    vocabulary, ~1.4 GiB at its default 256 sequences, more than the card leaves for one 8,192-token request. The check
    used to try only a shorter context and more GPUs; it now halves max_num_seqs too, and the change it names fits when
    followed, where twice as many sequences do not."""
    c = perfguide.check(config="vllm serve Qwen/Qwen3-8B --quantization fp8 --max-model-len 8192", hardware="rtx3060")
    assert not c.fits
    (seqs,) = [int(ch.setup["serving.max_num_seqs"]) for ch in c.changes if "serving.max_num_seqs" in ch.setup]
    assert any("--max-num-seqs" in e.keys for ch in c.changes for e in ch.edits)
    base = "vllm serve Qwen/Qwen3-8B --quantization fp8 --max-model-len 8192 --max-num-seqs "
    assert perfguide.check(config=base + str(seqs), hardware="rtx3060").fits
    assert not perfguide.check(config=base + str(2 * seqs), hardware="rtx3060").fits


def test_when_no_one_change_starts_the_server_the_combined_change_does() -> None:
    """Llama-3.1-8B on an L4 at --gpu-memory-utilization 0.75: no shorter context alone (down to 256 tokens), no eager
    mode alone and no fewer sequences alone start it (each checked here as its own command). The check then names a
    shorter context together with fewer sequences; followed, it starts, and at twice that context not even one
    sequence does, with or without CUDA graphs."""
    base = f"vllm serve {MODEL} --max-model-len 8192 --gpu-memory-utilization 0.75"
    assert not perfguide.check(config=base, hardware="l4").fits
    for single in ("--max-model-len 256", "--enforce-eager", "--max-num-seqs 1"):
        assert not perfguide.check(config=f"{base} {single}", hardware="l4").fits, single
    change = perfguide.check(config=base, hardware="l4").change("fit")
    assert change is not None and change.fits
    keys = change.edits[0].keys
    assert set(keys) >= {"--max-model-len", "--max-num-seqs"}
    followed = " ".join(f"{k} {v}" if v is not True else k for k, v in keys.items())
    assert perfguide.check(config=f"{base} {followed}", hardware="l4").fits
    longer = f"vllm serve {MODEL} --max-model-len {2 * int(keys['--max-model-len'])} --gpu-memory-utilization 0.75 --max-num-seqs 1"
    assert not perfguide.check(config=longer, hardware="l4").fits
    assert not perfguide.check(config=longer + " --enforce-eager", hardware="l4").fits
