"""Fuzzed inputs of ``perfguide check``: the config readers (perfguide/integrations/readers/) and launch / serve lines.

Files are the published examples under tests/data/check (TrainingArguments / TRL YAML, accelerate YAML, DeepSpeed
JSON, axolotl, LLaMA-Factory, torchtune) with values swapped for hostile strings, wrong types, huge numbers,
NaN/inf and deep nesting, keys dropped or added, then written back as JSON or YAML; plus byte-level junk
(truncations, binary, a nesting bomb, a YAML alias bomb). Commands are torchrun / accelerate / deepspeed launch
lines, TRL's / torchtune's / LLaMA-Factory's / axolotl's / ms-swift's / LitGPT's own commands and vllm / sglang serve commands
with fuzzed flags. The invariant is the CLI's: exit 0 (fits) or 3 (does
not fit) with a report, or exit 2 with exactly one line on stderr, never a traceback and never another status.
Used by tests/test_fuzz.py (a few examples) and bench/fuzz.py (the counted run).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import yaml
from fuzz_inputs import hostile_text, numbers, outcome, values
from hypothesis import strategies as st

DATA = Path(__file__).parent / "data" / "check"


def _published() -> list[tuple[str, dict[str, Any]]]:
    """(file name, parsed mapping) of every published example config (JSON or YAML) under tests/data/check."""
    out = []
    for p in sorted(DATA.rglob("*")):
        if p.suffix in (".json", ".yaml", ".yml"):
            text = p.read_text(encoding="utf-8")
            out.append((p.name, json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)))
    return out


PUBLISHED = _published()


def _paths(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path into nested mappings / lists, so a mutation can reach a leaf (stage, offload device, ...)."""
    found = [prefix] if prefix else []
    if isinstance(data, dict):
        for k, v in data.items():
            found += _paths(v, (*prefix, k))
    elif isinstance(data, list):
        for i, v in enumerate(data[:4]):
            found += _paths(v, (*prefix, i))
    return found


def _set(data: Any, path: tuple[Any, ...], value: Any, drop: bool) -> None:
    for k in path[:-1]:
        data = data[k]
    if drop and isinstance(data, dict):
        data.pop(path[-1], None)
    else:
        data[path[-1]] = value


def _nest(depth: int) -> Any:
    out: Any = 1
    for _ in range(depth):
        out = {"a": out}
    return out


wrong_values = (values | numbers | hostile_text | st.sampled_from([
    10**40, -(10**40), 2**63, float("nan"), float("inf"), -0.0, "auto", "none", "None", "cpu", "nvme", "zero3", "full_shard",
    [], {}, [1, 2], True, False, None, "bf16", "fp16", "fp8", "1e400", "0x10", "\u202e", "\x1b[2J", "a" * 10_000])
    | st.integers(min_value=1, max_value=400).map(_nest))


@st.composite
def mutated_example(draw: st.DrawFn) -> tuple[str, bytes]:
    """One published config with a few values replaced or dropped and a key or two added; JSON or YAML out."""
    import copy

    name, original = draw(st.sampled_from(PUBLISHED))
    data = copy.deepcopy(original)
    paths = _paths(data)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        if paths:
            _set(data, draw(st.sampled_from(paths)), draw(wrong_values), draw(st.booleans()))
            paths = _paths(data)
    for _ in range(draw(st.integers(min_value=0, max_value=2))):
        data[draw(hostile_text | st.sampled_from(["model_name_or_path", "base_model", "deepspeed", "fsdp", "fsdp_config",
                                                  "num_processes", "zero_optimization", "model", "stage", "quantization_bit"]))] = draw(wrong_values)
    suffix = draw(st.sampled_from([".json", ".yaml", Path(name).suffix]))
    if suffix == ".json":
        blob = json.dumps(data, default=str).encode()  # NaN / Infinity as Python's json writes them
    else:
        try:
            blob = yaml.safe_dump(data, allow_unicode=True).encode("utf-8", "surrogatepass")
        except (yaml.YAMLError, RecursionError, UnicodeEncodeError):
            blob = json.dumps(data, default=str).encode()  # JSON is YAML too
    return suffix, blob


@st.composite
def junk_file(draw: st.DrawFn) -> tuple[str, bytes]:
    """Byte-level damage: a truncated or bit-flipped published file, raw binary, nesting and alias bombs."""
    name, data = draw(st.sampled_from(PUBLISHED))
    text = json.dumps(data).encode() if name.endswith(".json") else yaml.safe_dump(data).encode()
    cut = draw(st.integers(min_value=0, max_value=len(text)))
    flips = draw(st.lists(st.tuples(st.integers(min_value=0, max_value=max(0, len(text) - 1)), st.integers(0, 255)), max_size=4))
    damaged = bytearray(text)
    for i, b in flips:
        if damaged:
            damaged[i] = b
    bomb = b"a: &a [x, x, x, x, x, x, x, x, x]\n" + b"".join(
        f"{c}: &{c} [{', '.join(['*' + chr(ord(c) - 1)] * 9)}]\n".encode() for c in "bcdefghi") + b"num_train_epochs: *i\n"
    blob = draw(st.sampled_from([bytes(text[:cut]), bytes(damaged), b"[" * 50_000 + b"]" * 50_000, b"{" * 5000, b"a:" + b" [" * 5000,
                                 b'{"zero_optimization": ' * 3000 + b"1" + b"}" * 3000, bomb, b"", b"\xff\xfe\x00", b"- 1\n- 2\n",
                                 b"stage: 3\n" * 2, b"!!python/object:os.system [ls]\n"]) | st.binary(max_size=300))
    return draw(st.sampled_from([".json", ".yaml", ".yml"])), blob


check_files = mutated_example() | junk_file()

# --- launch lines and serve commands ------------------------------------------------------------------------
flag_values = hostile_text | numbers.map(str) | st.sampled_from(["1", "2", "8", "0", "-1", "auto", "bf16", "fp8", "awq", "1e9",
                                                                 "99999999999999999999", "nan", "inf", "meta-llama/Llama-3.1-8B", ""])
models = st.sampled_from(["meta-llama/Llama-3.1-8B", "llama-3-8b", "gpt2", "Qwen/Qwen3-235B-A22B", "openai/gpt-oss-20b"])


def _pairs(*pairs: tuple[str, ...]) -> st.SearchStrategy[list[str]]:
    """Flags as a user writes them (each with a valid value), in any number and order: reaches the readers' deep paths."""
    return st.lists(st.sampled_from(pairs), max_size=5).map(lambda chosen: [w for pair in chosen for w in pair])


fuzzed_script_flags = st.lists(st.sampled_from([
    "--per_device_train_batch_size", "--gradient_accumulation_steps", "--bf16", "--fp16", "--optim", "--max_seq_length", "--max_length",
    "--deepspeed", "--fsdp", "--gradient_checkpointing", "--model_name_or_path", "--use_peft", "--load_in_4bit", "--lora_r", "--packing",
    "--bogus"]) | flag_values, max_size=8)
script_flags = _pairs(("--per_device_train_batch_size", "2"), ("--gradient_accumulation_steps", "4"), ("--bf16",), ("--fp16",),
                      ("--optim", "adamw_torch"), ("--optim", "adamw_bnb_8bit"), ("--gradient_checkpointing",), ("--fsdp", "full_shard"),
                      ("--use_peft",), ("--lora_r", "16"), ("--load_in_4bit",), ("--packing",), ("--max_length", "1024")) | fuzzed_script_flags
fuzzed_serve_flags = st.lists(st.sampled_from([
    "--tensor-parallel-size", "--tp", "--max-model-len", "--context-length", "--quantization", "--dtype", "--gpu-memory-utilization",
    "--mem-fraction-static", "--max-num-seqs", "--kv-cache-dtype", "--pipeline-parallel-size", "--data-parallel-size",
    "--enable-expert-parallel", "--bogus", "--max-num-batched-tokens", "--enforce-eager"]) | flag_values, max_size=8)
serve_flags = _pairs(("--tensor-parallel-size", "2"), ("--max-model-len", "8192"), ("--quantization", "fp8"), ("--dtype", "bfloat16"),
                     ("--gpu-memory-utilization", "0.85"), ("--max-num-seqs", "64"), ("--kv-cache-dtype", "fp8"),
                     ("--enable-expert-parallel",), ("--data-parallel-size", "2"), ("--enforce-eager",)) | fuzzed_serve_flags
launchers = st.sampled_from([["torchrun", "--nproc_per_node"], ["accelerate", "launch", "--num_processes"], ["deepspeed", "--num_gpus"],
                             ["python", "-m", "torch.distributed.run", "--nproc-per-node"], ["torchrun", "--nnodes"]])
launch_lines = st.builds(lambda launcher, n, model, flags: [*launcher, n, "train.py", "--model_name_or_path", model, *flags],
                         launchers, st.sampled_from(["1", "2", "8"]) | flag_values, models | hostile_text, script_flags)
serve_lines = st.builds(lambda head, model, flags: [*head, model, *flags],
                        st.sampled_from([["vllm", "serve"], ["python", "-m", "sglang.launch_server", "--model-path"],
                                         ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model"]]),
                        models | hostile_text, serve_flags)
launch_flags = _pairs(("--num_processes", "2"), ("--accelerate_config", "zero3"), ("--accelerate_config", "fsdp2"),
                     ("--mixed_precision", "bf16"), ("--config", str(DATA / "trl_example_config.yaml"))) | fuzzed_script_flags
trl_lines = st.builds(lambda sub, model, flags, launch: ["trl", sub, "--model_name_or_path", model, *flags, *launch],
                      st.sampled_from(["sft", "dpo", "grpo", ""]), models | hostile_text, script_flags, launch_flags)
overrides = st.lists(st.sampled_from(["batch_size=2", "tokenizer.max_seq_len=4096", "per_device_train_batch_size=4", "cutoff_len=8192",
                                      "model=3", "a.b.c=x", "=1", "~x", "enable_activation_checkpointing=false"]) | flag_values, max_size=4)
tool_lines = st.one_of(
    st.builds(lambda n, o: ["tune", "run", "--nproc_per_node", n, "lora_finetune_distributed", "--config",
                            str(DATA / "torchtune_llama3_2_1B_lora_single_device.yaml"), *o], st.sampled_from(["1", "2"]) | flag_values, overrides),
    st.builds(lambda o: ["llamafactory-cli", "train", str(DATA / "llamafactory_qwen3_lora_sft_ds3.yaml"), *o], overrides),
    st.builds(lambda f: ["axolotl", "train", str(DATA / "axolotl_lora-1b.yml"), *f], script_flags | fuzzed_script_flags))
env_words = st.lists(st.sampled_from(["CUDA_VISIBLE_DEVICES=0", "CUDA_VISIBLE_DEVICES=0,1", "NPROC_PER_NODE=2", "NNODES=2", "X=1", "A="])
                     | flag_values.map(lambda v: f"NPROC_PER_NODE={v}"), max_size=3)
swift_flags = _pairs(("--tuner_type", "full"), ("--torch_dtype", "bfloat16"), ("--quant_method", "bnb"), ("--quant_bits", "4"),
                     ("--deepspeed", "zero3"), ("--fsdp", "fsdp2"), ("--max_length", "1024"), ("--per_device_train_batch_size", "2"),
                     ("--task_type", "seq_cls"), ("--num_labels", "3"), ("--lora_rank", "16"), ("--packing", "true"),
                     ("--attn_impl", "flash_attn"), ("--sequence_parallel_size", "2")) | fuzzed_script_flags
swift_lines = st.builds(lambda env, sub, model, flags: [*env, "swift", sub, "--model", model, *flags], env_words,
                        st.sampled_from(["sft", "pt", "rlhf", ""]), models | hostile_text, swift_flags)
litgpt_flags = _pairs(("--precision", "bf16-true"), ("--quantize", "bnb.nf4"), ("--devices", "2"), ("--train.micro_batch_size", "2"),
                      ("--train.max_seq_length", "512"), ("--lora_mlp", "true"), ("--optimizer", "AdamW"), ("--lora_head", "true")) | fuzzed_script_flags
litgpt_lines = st.builds(lambda sub, model, flags: ["litgpt", sub, model, *flags],
                         st.sampled_from(["finetune_lora", "finetune", "finetune_full", "finetune_adapter", ""]), models | hostile_text, litgpt_flags)
check_commands = launch_lines | serve_lines | trl_lines | tool_lines | swift_lines | litgpt_lines


def cli_check(argv: list[str]) -> str:
    """``perfguide check ARGV``: exit 0/3 is a result, exit 2 with one stderr line a refusal, anything else a bug."""
    from perfguide.cli import main

    def run() -> None:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            code = main(["check", "--hardware", "a100-80gb:8", *argv])
        said = [line for line in err.getvalue().splitlines() if line.strip()]
        if "Traceback" in err.getvalue() or code not in (0, 2, 3):
            raise AssertionError(f"exit {code}: {err.getvalue()[-200:]!r}")
        if code == 2 and len(said) != 1:
            raise AssertionError(f"exit 2 with {len(said)} lines on stderr: {said[:3]!r}")
        if code == 2:
            from perfguide import PerfGuideError

            raise PerfGuideError(said[0])

    return outcome(run)


def check_file(suffix: str, blob: bytes, model: str | None, directory: Path) -> str:
    path = directory / f"config{suffix}"
    path.write_bytes(blob)
    return cli_check([str(path), *(["--model", model] if model else []), "--seq-len", "512"])


def check_command(words: list[str]) -> str:
    """A serve command takes every setting from its own flags; a launch line gets the sequence length from outside."""
    serve = words[0] == "vllm" or "sglang.launch_server" in words or "vllm.entrypoints.openai.api_server" in words
    return cli_check([*([] if serve else ["--seq-len", "512"]), "--", *words])
