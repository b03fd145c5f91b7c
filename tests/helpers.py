"""Builders for tests that need a Recommendation without the rules engine, and a tiny real HF model.

Recommendations are assembled directly (Request + Setup + zeroed MemoryEstimate/Throughput) so the
adapters can be tested on exactly the Setup a test names. The tiny model is a real LlamaForCausalLM
built from a config (never downloaded), small enough to train a few steps on one CPU core.
"""

from __future__ import annotations

import csv
import functools
import importlib
import importlib.util
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from perfguide import CPU, GPU, Hardware, MemoryEstimate, ModelSpec, PerfGuideError, Recommendation, Setup, Throughput
from perfguide.scenarios.types import Constraints, Request

GiB = 1024**3

# words that point the user at what is accepted
POINTERS = ("accepted", "use ", "e.g.", "pick ", "pass ", "expected", "must be", "did you mean", "supported", "needs ", "should be")

TINY_LLAMA = dict(
    vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
)
TINY_SEQ = 16


def cpu_box(cores: int = 2) -> CPU:
    return CPU(model_name="test-cpu", physical_cores=cores, logical_cores=cores, ram_total=16 * GiB, ram_available=12 * GiB)


def gpu(kind: str) -> GPU:
    """Spec-sheet facts that matter to the adapters: name, memory and compute capability."""
    table = {
        "a100": ("NVIDIA A100-SXM4-80GB", 80, (8, 0)),
        "t4": ("Tesla T4", 16, (7, 5)),
        "h100": ("NVIDIA H100 80GB HBM3", 80, (9, 0)),
    }
    name, gib, cc = table[kind]
    return GPU(name=name, memory_total=gib * GiB, memory_free=gib * GiB, compute_capability=cc)


def hardware(kind: str = "cpu", count: int = 1, nodes: int = 1) -> Hardware:
    gpus = () if kind == "cpu" else tuple(gpu(kind).model_copy(update={"index": i}) for i in range(count))
    return Hardware(gpus=gpus, cpu=cpu_box(), nodes=nodes, source="named", interconnect="nvlink" if count > 1 else "none")


def tiny_config(**update: Any) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(**{**TINY_LLAMA, **update})


def moe_config(model_type: str, hidden: int, width: int, experts: int, top_k: int) -> dict[str, Any]:
    """A two-layer Mixtral / Qwen3-MoE config dict (AutoConfig.for_model's kwargs) of the given expert shape."""
    common = {"model_type": model_type, "hidden_size": hidden, "num_attention_heads": 5, "num_key_value_heads": 1,
              "head_dim": 16, "num_hidden_layers": 2, "vocab_size": 384, "max_position_embeddings": 512,
              "tie_word_embeddings": False, "num_experts_per_tok": top_k}
    if model_type == "mixtral":
        return {**common, "intermediate_size": width, "num_local_experts": experts}
    return {**common, "intermediate_size": 3 * hidden, "moe_intermediate_size": width, "num_experts": experts, "norm_topk_prob": True}


def moe_peft_model(config: dict[str, Any], targets: Any, dtype: Any, r: int, experts_implementation: str | None = None) -> Any:
    """A real peft LoRA (alpha 8, no dropout: ParamWrapper refuses it) on a tiny MoE built from ``moe_config``."""
    import peft
    import torch
    import transformers

    torch.manual_seed(0)
    kwargs = {"experts_implementation": experts_implementation} if experts_implementation else {}
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config),
                                                          attn_implementation="sdpa", dtype=dtype, **kwargs)
    return peft.get_peft_model(model, peft.LoraConfig(r=r, lora_alpha=8, target_modules=targets, lora_dropout=0.0)).train()


def tiny_model(seed: int = 0, **update: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_config(**update))


def tiny_spec(**update: Any) -> ModelSpec:
    """The tiny Llama's shape, with parameter counts taken from the real module."""
    model = tiny_model()
    embed = model.get_input_embeddings().weight.numel()
    head = 0 if model.config.tie_word_embeddings else model.get_output_embeddings().weight.numel()
    c = model.config
    spec = dict(
        name="tiny-llama", model_type="llama", architecture="LlamaForCausalLM", family="llama",
        hidden_size=c.hidden_size, num_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=c.hidden_size // c.num_attention_heads,
        intermediate_size=c.intermediate_size, vocab_size=c.vocab_size, max_position_embeddings=c.max_position_embeddings,
        total_params=sum(p.numel() for p in model.parameters()), embedding_params=embed, lm_head_params=head, source="config",
    )
    spec.update(update)
    return ModelSpec(**spec)


def make_rec(setup: dict[str, Any] | Setup, hw: Hardware | None = None, scenario: str | None = None,
             spec: ModelSpec | None = None, **constraints: Any) -> Recommendation:
    """A Recommendation around exactly this Setup; memory/throughput are zero (the adapters ignore them)."""
    setup = Setup.parse(setup)
    hw = hw if hw is not None else hardware("cpu" if setup.device == "cpu" else "a100", setup.num_gpus, setup.nodes)
    if scenario is None:
        where = "cpu" if setup.device == "cpu" else ("gpu_many" if setup.num_gpus > 1 else "gpu_one")
        scenario = f"{setup.task}_{where}"
    request = Request(scenario=scenario, model=spec or tiny_spec(), hardware=hw, seq_len=setup.seq_len,
                      global_batch_size=setup.global_batch_size, constraints=Constraints(**constraints))
    zero = MemoryEstimate(weights=0, gradients=0, optimizer_states=0, activations=0, peak_allocated=0, peak_reserved=0, device_total=0)
    return Recommendation(request=request, setup=setup, memory=zero, throughput=Throughput(step_time_s=0, tokens_per_s=0), decisions=())


def prepared_tiny_qlora(tmp_path: Path, **setup: Any) -> tuple[ModelSpec, Recommendation, Any]:
    """A tiny Llama saved, reloaded with the plan's model_kwargs (nf4, bf16 autocast) and put through prepare_model:
    the module a user would train, to compare with what the plan priced."""
    from transformers import AutoModelForCausalLM

    base = tiny_model(vocab_size=512, hidden_size=64, intermediate_size=128)
    base.save_pretrained(tmp_path / "base")
    spec = ModelSpec.from_any(base)
    rec = make_rec({"device": "cpu", "weights_dtype": "nf4", "autocast": "bf16", "optimizer": "adamw_torch", **setup},
                   spec=spec)
    model = rec.prepare_model(AutoModelForCausalLM.from_pretrained(tmp_path / "base", **rec.model_kwargs()))
    return spec, rec, model


def frozen_head_batch(b: int, s: int, h: int, v: int) -> tuple[Any, Any, Any]:
    """A frozen bf16 LM head, a bf16 hidden batch that wants its gradient (LoRA's case) and random labels: what a
    loss-path trace feeds the tracker."""
    import torch

    head = torch.nn.Linear(h, v, bias=False).to(torch.bfloat16).requires_grad_(False)
    x = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
    return head, x, torch.randint(0, v, (b, s))


def tiny_tokenizer() -> Any:
    """A real fast tokenizer over the tiny models' 128 ids (t0..t127), built locally: SFTTrainer needs one."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(TINY_LLAMA["vocab_size"])}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", pad_token="t1", eos_token="t2")


def token_dataset(n: int = 16, seed: int = 0) -> list[dict[str, Any]]:
    """Random token rows for causal-LM training (labels = inputs)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (n, TINY_SEQ), generator=g)
    return [{"input_ids": row, "labels": row.clone()} for row in ids]


def reset_accelerate_state() -> None:
    """accelerate keeps one process-wide state; tests building Accelerators with other settings start afresh
    (TrainingArguments does the same reset when it sets up devices)."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)


def accelerate_fsdp2(rec: Recommendation, model: Any, mixed_precision: str) -> Any:
    """``model`` put through accelerate's own ``fsdp2_prepare_model`` with the plan's FSDP plugin, on the one-rank gloo
    group a test holds (CPU): the wrap, the upcast and the mixed-precision policy a user's run gets."""
    from types import SimpleNamespace

    import torch
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model

    from perfguide.integrations.accelerate import fsdp_plugin

    plugin = fsdp_plugin(rec)
    if mixed_precision != "no":
        plugin.set_mixed_precision(mixed_precision)   # what AcceleratorState does with a mixed_precision
    plugin.set_auto_wrap_policy(model)
    shim = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), device=torch.device("cpu"), is_main_process=True,
                           mixed_precision=mixed_precision, torch_device_mesh=None, parallelism_config=None)
    return fsdp2_prepare_model(shim, model)


def one_line(exc: pytest.ExceptionInfo[BaseException], *named: str) -> str:
    """The message is one line, names each of ``named`` and points at what is accepted."""
    msg = str(exc.value)
    assert isinstance(exc.value, PerfGuideError), type(exc.value)
    assert "\n" not in msg and msg.strip() == msg and msg, msg
    for text in named:
        assert text.lower() in msg.lower(), (text, msg)
    assert any(p in msg.lower() for p in POINTERS), msg
    return msg


BENCH = Path(__file__).resolve().parent.parent / "bench"
SCRIPTS = BENCH.parent / "scripts"


def _load_from(folder: Path, name: str) -> ModuleType:
    """``folder/name.py`` as a module, loaded once, with ``folder`` on the path (its scripts import their siblings)."""
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_bench(name: str) -> ModuleType:
    """A bench script as a module (bench/ is not a package)."""
    return _load_from(BENCH, name)


def load_script(name: str) -> ModuleType:
    """A trace script of scripts/ as a module (not a package either)."""
    return _load_from(SCRIPTS, name)


@functools.cache
def published_rows() -> dict[str, dict[str, str]]:
    """The memory bench's published rows by row id (bench/data/published_measurements.csv), read once."""
    with (BENCH / "data" / "published_measurements.csv").open(encoding="utf-8", newline="") as f:
        return {r["row_id"]: r for r in csv.DictReader(f)}


def read_row(row_id: str) -> tuple[dict[str, str], ModelSpec, Setup]:
    """A training row with the ModelSpec and Setup bench/accuracy.py reads from it (the row tests check that reading)."""
    row = published_rows()[row_id]
    spec: ModelSpec = load_bench("accuracy_spec")._spec(row["model_hf_id"])
    setup: Setup = load_bench("accuracy_setup")._train_setup(row, spec)
    return row, spec, setup


def block_pair_per_row(build: Callable[[int], dict[str, Any]], spec: ModelSpec, source: int, target: int, attn: str,
                       **regime: Any) -> tuple[float, float]:
    """(traced, priced) bytes one encoder + one decoder block keep per batch row: a two-pair fake-tensor trace of the
    real transformers model minus a one-pair trace (``build(pairs)`` gives the config), at batches 2 and 4 so per-block
    constants cancel, against memory/seq2seq.block_bytes (the encoder block at the source, the decoder's at the target)."""
    from perfguide.memory.seq2seq import block_bytes
    from perfguide.memory.tracing.step import run_step

    def activations(config: dict[str, Any], setup: Setup) -> int:
        return run_step(config, setup).phases["head"].parts.get("activations", 0)

    traced, priced = [], []
    for batch in (2, 4):
        setup = Setup(micro_batch_size=batch, seq_len=source, target_len=target, optimizer="sgd", attn_implementation=attn,
                      **regime)
        traced.append(activations(build(2), setup) - activations(build(1), setup))
        priced.append(sum(block_bytes(spec, setup)))
    return (traced[1] - traced[0]) / 2, (priced[1] - priced[0]) / 2


def assert_evaluated_as_values(ids: tuple[str, ...]) -> None:
    """Each row is compared by bench/accuracy.py as a measured value, in the number the source printed."""
    accuracy, rows = load_bench("accuracy"), published_rows()
    for row_id in ids:
        result = accuracy.evaluate(rows[row_id], [])
        assert result.kind == "value", result
        assert result.published == float(rows[row_id]["peak_mem_value"]), row_id


def meta_total(hub: str) -> int:
    """Parameters of the module transformers builds from a catalog entry's config on the meta device (its own config
    class and head class, no perfguide counting)."""
    import torch
    import transformers

    from perfguide.model.catalog import config_of

    config = config_of(hub)
    hf = transformers.AutoConfig.for_model(**{k: v for k, v in config.items() if k not in ("architectures", "_name_or_path")})
    with torch.device("meta"):
        module = getattr(transformers, config["architectures"][0])._from_config(hf)
    return sum(p.numel() for p in module.parameters())


@contextmanager
def damaged_data(monkeypatch: pytest.MonkeyPatch, name: str, edit: Callable[[Any], object]) -> Iterator[None]:
    """perfguide/data/NAME.json as ``edit`` leaves a deep copy of it, for the validated loaders to read afresh."""
    from perfguide import _data

    real = _data.load
    raw = json.loads(json.dumps(real(name)))
    edit(raw)
    monkeypatch.setattr(_data, "load", lambda n: raw if n == name else real(n))
    _data.validated.cache_clear()
    try:
        yield
    finally:
        _data.validated.cache_clear()


def script_trace(name: str) -> Any:
    """``scripts/<name>.py``'s ``trace()``, run with the scripts folder on sys.path: the ranks it spawns import the
    script by name from there."""
    folder = str(Path(__file__).resolve().parents[1] / "scripts")
    sys.path.insert(0, folder)
    try:
        return importlib.import_module(name).trace()
    finally:
        sys.path.remove(folder)


def block_saved_bytes(config: dict[str, Any], batch: int, seq: int, attn_implementation: str = "sdpa") -> int:
    """Bytes of the storages block 1 of the real bf16 model (SDPA unless told, training mode) saves for backward,
    counted with ``saved_tensors_hooks``: the tracer's answer checked without the tracer."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    torch.manual_seed(0)
    hf_config = transformers.AutoConfig.for_model(**config)
    model = transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation=attn_implementation,
                                                          dtype=torch.bfloat16).train()
    # the decoder stack: model.layers (Llama and most), transformer.h (GPT-2, Falcon, BLOOM, GPT-BigCode)
    blocks = next(m for m in model.modules() if isinstance(m, torch.nn.ModuleList))
    return saved_in_block(model, blocks[1], torch.randint(0, hf_config.vocab_size, (batch, seq)))


def priced_layer_bytes(config: dict[str, Any], batch: int, seq: int) -> int:
    """``memory.activations.layer_bytes`` of the spec read from ``config``: bf16 weights, training, at ``batch`` x ``seq``."""
    from perfguide.memory.activations import layer_bytes

    setup = Setup(task="train", micro_batch_size=batch, seq_len=seq, weights_dtype="bf16", optimizer="sgd")
    return layer_bytes(ModelSpec.from_any(config), setup)


def model_saved_bytes(config: dict[str, Any], layers: int, batch: int, seq: int) -> int:
    """Bytes of the storages a real bf16 model of ``config`` cut to ``layers`` layers saves for backward in one training
    forward (CPU, SDPA, ``saved_tensors_hooks``; parameters left out): two depths differenced give what one more layer
    adds, with its share of what the model computes for every layer before the first block (Gemma's per-layer
    embeddings), which ``block_saved_bytes`` leaves out."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cut = {**config, "num_hidden_layers": layers}
    for key in ("layer_types", "intermediate_size", "activation_sparsity_pattern"):   # per-layer lists
        if isinstance(config.get(key), list):
            cut[key] = config[key][:layers]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cut), attn_implementation="sdpa",
                                                          dtype=torch.bfloat16).train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: Any) -> Any:
        if t.untyped_storage().data_ptr() not in params:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(0, cut["vocab_size"], (batch, seq))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, labels=ids, use_cache=False)
    return sum(seen.values())


def saved_in_block(model: Any, block: Any, ids: Any, autocast: bool = False) -> int:
    """Bytes of the storages ``block`` saves for backward in one training forward of ``model`` on ``ids`` (bf16
    autocast on CPU if asked): the parameters, and what earlier blocks saved first (the rotary cos / sin every block
    shares), are not the block's."""
    import contextlib

    import torch

    outside = {p.untyped_storage().data_ptr() for p in model.parameters()}
    inside, seen = [False], {}

    def pack(t: Any) -> Any:
        storage = t.untyped_storage()
        if not inside[0]:
            outside.add(storage.data_ptr())
        elif storage.data_ptr() not in outside:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    hooks = [block.register_forward_pre_hook(lambda m, a: inside.__setitem__(0, True)),
             block.register_forward_hook(lambda m, a, o: inside.__setitem__(0, False))]
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    try:
        with ctx, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(input_ids=ids, labels=ids, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    return sum(seen.values())


def pypi_release(package: str, version: str, tmp: Path) -> Path:
    """``package`` ``version`` unpacked under ``tmp`` (its wheel from PyPI, no dependencies), to run or read a release
    other than the installed one; the test is skipped where PyPI cannot be reached."""
    import subprocess
    import sys
    import zipfile

    wheels = tmp / "wheels"
    got = subprocess.run([sys.executable, "-m", "pip", "download", f"{package}=={version}", "--no-deps", "-d", str(wheels),
                          "-q"], capture_output=True, text=True, timeout=300)
    wheel = next(wheels.glob(f"{package}-{version}-*.whl"), None) if wheels.exists() else None
    if got.returncode or wheel is None:
        pytest.skip(f"{package} {version} wheel not downloadable here: {got.stderr.strip()[-200:]}")
    target = tmp / f"{package}-{version}"
    with zipfile.ZipFile(wheel) as whl:
        whl.extractall(target)
    return target


def throughput_rows_in(rows: ModuleType, ids: range) -> tuple[dict, dict[str, str], list[dict[str, str]], list[dict[str, str]]]:
    """bench/throughput_rows.py read as the bench reads it, for one source's row ids: (priced cases by id, why each
    skipped row is skipped, that source's CSV rows, every CSV row)."""
    import csv

    cases, skipped = rows.load()
    with rows.CSV.open(newline="", encoding="utf-8") as f:
        every = list(csv.DictReader(f))
    return ({c.row_id: c for c in cases}, {r["row_id"]: why for r, why in skipped},
            [r for r in every if int(r["row_id"]) in ids], every)


def live_storages(*given: Any) -> Any:
    """A TorchDispatchMode that counts the bytes of every storage the dispatched ops create until it is freed
    (``.live``, ``.peak``); views of the ``given`` tensors share their storage and are not counted. Built on call so
    that torch is imported only by the tests that trace."""
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Live(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.live = self.peak = 0
            self.sizes: dict[int, int] = {t.untyped_storage().data_ptr(): 0 for t in given}

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() and t.untyped_storage().data_ptr() not in self.sizes:
                    storage = t.untyped_storage()
                    self.sizes[storage.data_ptr()] = storage.nbytes()
                    self.live += storage.nbytes()
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self.free, storage.data_ptr())
            return out

        def free(self, key: int) -> None:
            self.live -= self.sizes.pop(key, 0)

    return Live()


def with_keys(data: dict[str, Any], keys: dict[str, Any]) -> dict[str, Any]:
    """A copy of a parsed config with ``keys`` (dotted, as a check's Edit writes them) set into it, as a user applies
    the change (and as ``tune run ... key=value`` overrides do)."""
    from perfguide.integrations.readers.base import nest

    def merge(into: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
        return {**into, **{k: merge(into[k], v) if isinstance(v, dict) and isinstance(into.get(k), dict) else v for k, v in new.items()}}

    return merge(data, nest(keys))


def cpu_plan_trains_a_step(config: dict[str, Any], finetune: str, tmp_path: Path) -> Any:
    """A train_cpu plan for the tiny ``config`` (vocabulary 512) through transformers' Trainer for one step: the plan's
    TrainingArguments and prepare_model accepted by the real loop. Returns the plan."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import perfguide

    rec = perfguide.recommend(config, "train_cpu", hardware="cpu", seq_len=128, global_batch_size=2, finetune=finetune)
    model = rec.prepare_model(transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config)))
    args = rec.training_args(output_dir=str(tmp_path), max_steps=1, report_to=[], save_strategy="no")
    rows = [{"input_ids": torch.randint(0, 512, (128,)), "labels": torch.randint(0, 512, (128,))} for _ in range(4)]
    out = transformers.Trainer(model=model, args=args, train_dataset=rows).train()
    assert out.global_step == 1 and out.training_loss > 0
    return rec
