"""The engine registry: one module per engine, discovered; nothing outside perfguide/engines/ names one; an
engine written in a file of its own plans, prices and prints its command with no other file touched."""

from __future__ import annotations

import ast
import importlib.util
import math
import subprocess
import textwrap
from pathlib import Path

import pytest
from helpers import one_line

import perfguide
from perfguide import PerfGuideError, engines
from perfguide._serving_data import serving_facts
from perfguide.memory.serving import kv_bytes_per_token

PACKAGE = Path(perfguide.__file__).parent

TOY = textwrap.dedent('''
    """ToyServe: a made-up server that keeps a fixed fraction of the GPU for weights + KV, in pages of 32 tokens."""
    from typing import Any, ClassVar

    from perfguide._serving_data import EngineFacts
    from perfguide.engines import Flag, ServerEngine

    FORMAT = {"choice": None, "at_load": True, "min_cc": [8, 0], "vendors": ["nvidia"]}


    class ToyServe(ServerEngine):
        name: ClassVar[str] = "toyserve"
        title: ClassVar[str] = "ToyServe"
        order: ClassVar[int] = 90
        docs_source: ClassVar[str] = "https://example.org/toyserve/docs/arguments"
        memory_setting: ClassVar[str] = "memory_fraction"
        memory_source: ClassVar[str] = "https://example.org/toyserve/docs/memory (fraction x total, weights included)"

        @property
        def facts(self) -> EngineFacts:
            return EngineFacts(version="1.0", default_gpu_memory_utilization=0.8, block_size=32, non_torch_bytes=0,
                               non_torch_bytes_per_tp_rank=0, cuda_graph_bytes_per_size=0, max_cuda_graph_size=1,
                               step_overhead_s=0.001, source="https://example.org/toyserve/docs/memory",
                               formats={"bf16": FORMAT, "fp8": {**FORMAT, "choice": "f8"}},
                               formats_source="https://example.org/toyserve/docs/quantization")

        def utilization(self, gpu, hardware, serving, headroom) -> float:
            return 0.8

        def budget(self, total: int, context: int, serving) -> int:
            return int(total * serving.gpu_memory_utilization)

        def kv_bytes(self, budget: int, weights: int, activation: int, non_torch: int, graphs: int) -> int:
            return budget - weights

        def args(self, model: str, serving) -> dict[str, Any]:
            return {"model": model, "fraction": serving.gpu_memory_utilization, "tp": serving.tensor_parallel_size,
                    "quant": self.quantization_choice(serving)}

        def launcher(self, model: str) -> list[str]:
            return ["toyserve", model]

        def flags(self, model: str, serving) -> list[Flag]:
            kw = self.args(model, serving)
            return [(f"--{k}", str(v)) for k, v in kw.items() if k != "model" and v is not None]


    ENGINE = ToyServe()
''')


def test_names_lists_the_three_engines_default_first() -> None:
    assert engines.names()[:3] == ["transformers", "vllm", "sglang"]
    assert engines.default().name == "transformers"
    assert [e.name for e in engines.servers()] == ["vllm", "sglang"]
    with pytest.raises(PerfGuideError) as e:
        engines.get("vlm")
    one_line(e, "vllm")


def test_every_server_format_has_its_facts_and_a_choice_of_its_parser() -> None:
    """Each engine's quantization values are among the choices its pinned parser registers."""
    import json

    flags = json.loads((Path(__file__).parent / "data" / "engine_flags.json").read_text())
    for engine in engines.servers():
        assert set(engine.formats) <= set(serving_facts().formats)
        assert engine.version == flags[engine.name]["version"]
        for fmt in engine.quantizations():
            assert engine.formats[fmt].choice in flags[engine.name]["quantization"], (engine.name, fmt)


def _engine_names_in(path: Path, names: set[str]) -> list[tuple[int, str]]:
    """Engine names a branch tests against: string constants in a comparison (``e == "vllm"``, ``e in ("vllm",
    ...)``) or as the keys of a dict literal (a lookup table by engine). A foreign format's own key list (axolotl's
    ``vllm:`` section) or prose is not a branch."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            consts = [c for o in operands for c in ([o] if isinstance(o, ast.Constant) else
                                                     o.elts if isinstance(o, (ast.Tuple, ast.List, ast.Set)) else [])]
        elif isinstance(node, ast.Dict):
            consts = [k for k in node.keys if k is not None]
        else:
            continue
        found += [(c.lineno, c.value) for c in consts if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value in names]
    return found


def test_nothing_outside_engines_names_a_serving_engine() -> None:
    """A branch on an engine's name anywhere else would make a new engine touch that file too. (The default
    engine's name is also the name of the transformers library, which other modules import: it is left out.)"""
    names = {e.name for e in engines.servers()}
    found = [f"{p.relative_to(PACKAGE)}:{line} {value!r}" for p in sorted(PACKAGE.rglob("*.py"))
             if "engines" not in p.relative_to(PACKAGE).parts for line, value in _engine_names_in(p, names)]
    assert not found, found


def test_the_checker_sees_an_engine_name(tmp_path: Path) -> None:
    bad = tmp_path / "x.py"
    bad.write_text('"""vllm"""\nKEYS = ("vllm", "seed")\n\ndef f(e):\n    return e == "vllm" or e in ("sglang",) or {"vllm": 1}[e]\n')
    assert sorted(_engine_names_in(bad, {"vllm", "sglang"})) == [(5, "sglang"), (5, "vllm"), (5, "vllm")]


def _load_toy(tmp_path: Path) -> engines.Engine:
    path = tmp_path / "toyserve.py"
    path.write_text(TOY)
    spec = importlib.util.spec_from_file_location("toyserve", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return engines.register(module.ENGINE)


def test_a_toy_engine_in_one_file_plans_prices_and_prints_its_command(tmp_path: Path) -> None:
    before = subprocess.run(["git", "status", "--porcelain"], cwd=PACKAGE.parent, capture_output=True, text=True).stdout
    toy = _load_toy(tmp_path)
    try:
        assert "toyserve" in engines.names()
        r = perfguide.recommend("meta-llama/Llama-3.1-8B", "infer_gpu_one", hardware="a100-80gb", engine="toyserve",
                                prompt_len=1024, max_new_tokens=1024)
        s = r.setup.serving
        assert r.fits and s is not None and s.engine == "toyserve" and s.weight_format in ("bf16", "fp8")
        # its own rule by hand: 0.8 x CUDA's total - weights, in pages of 32 tokens
        total = round(79.14 * 2**30)  # CUDA's total on an A100 80GB, as torch prints it
        kv = int(total * 0.8) - r.engine_memory.weights
        per_token = kv_bytes_per_token(r.model, s)
        assert per_token == 32 * 2 * 8 * 128 * 2
        assert r.kv_cache_tokens == kv // (32 * per_token) * 32
        assert r.max_concurrency == pytest.approx(kv // (32 * per_token) / math.ceil(2048 / 32))
        assert r.decision("memory_fraction") is not None and r.decision("engine").value == "toyserve"
        assert r.engine_args() == {"model": "meta-llama/Llama-3.1-8B", "fraction": 0.8, "tp": 1,
                                   "quant": "f8" if s.weight_format == "fp8" else None}
        assert r.serve_command().startswith("toyserve meta-llama/Llama-3.1-8B --fraction 0.8 --tp 1")
        assert r.serve_command() in r.report()
        with pytest.raises(PerfGuideError) as e:
            perfguide.recommend("meta-llama/Llama-3.1-8B", "infer_gpu_one", hardware="a100-80gb", engine="toyserve", quantization="awq")
        one_line(e, "toyserve")
    finally:
        engines.unregister(toy.name)
    assert "toyserve" not in engines.names()
    after = subprocess.run(["git", "status", "--porcelain"], cwd=PACKAGE.parent, capture_output=True, text=True).stdout
    assert after == before                                                   # no file of the package was touched


def test_a_name_taken_is_refused_and_the_library_engine_has_no_command() -> None:
    with pytest.raises(PerfGuideError) as e:
        engines.register(type(engines.get("vllm"))())
    one_line(e, "vllm")
    r = perfguide.recommend("meta-llama/Llama-3.1-8B", "infer_gpu_one", hardware="a100-80gb")
    with pytest.raises(PerfGuideError) as e:
        r.serve_command()
    one_line(e, "engine='vllm' or 'sglang'")
