"""Extract the argument names the pinned vLLM and SGLang versions accept, from their wheels' parser sources.

vLLM and SGLang pin CUDA torch builds and older transformers than this project's test environment, so they
cannot be installed next to it; the adapters' output is instead checked against the names their own parser
definitions register. Usage (wheels from `pip download --no-deps vllm==V sglang==V -d DIR`):

    python scripts/engine_flags.py DIR/vllm-*.whl DIR/sglang-*.whl > tests/data/engine_flags.json

Only names are written (flag strings, EngineArgs fields, accepted choice values), never the engines' code.
"""

from __future__ import annotations

import ast
import json
import re
import sys
import zipfile


def _strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _add_argument_flags(tree: ast.AST) -> set[str]:
    flags = set()
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "add_argument":
            flags |= {a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")}
    return flags


def _class_fields(tree: ast.AST, name: str) -> list[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return [s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
    return []


def _literal_values(tree: ast.AST, alias: str) -> list[str]:
    """Values of ``alias = Literal[...]`` (vLLM's QuantizationMethods, CacheDType)."""
    for node in ast.walk(tree):
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        if any(isinstance(t, ast.Name) and t.id == alias for t in targets) and getattr(node, "value", None) is not None:
            return [s for s in _strings(node.value) if s != "Literal"]
    return []


def vllm(path: str) -> dict:
    with zipfile.ZipFile(path) as z:
        version = re.search(r"vllm-([^-]+)-", path.rsplit("/", 1)[-1]).group(1)
        arg_utils = ast.parse(z.read("vllm/engine/arg_utils.py"))
        quant = ast.parse(z.read("vllm/model_executor/layers/quantization/__init__.py"))
        cache = ast.parse(z.read("vllm/config/cache.py"))
    return {"version": version, "source": "vllm/engine/arg_utils.py (EngineArgs fields, add_cli_args flags); "
            "vllm/model_executor/layers/quantization/__init__.py QuantizationMethods; vllm/config/cache.py CacheDType",
            "engine_args": sorted(_class_fields(arg_utils, "EngineArgs")), "flags": sorted(_add_argument_flags(arg_utils)),
            "quantization": sorted(_literal_values(quant, "QuantizationMethods")), "kv_cache_dtype": sorted(_literal_values(cache, "CacheDType"))}


def sglang(path: str) -> dict:
    flags: set[str] = set()
    choices: list[str] = []
    kv_choices: list[str] = []
    with zipfile.ZipFile(path) as z:
        version = re.search(r"sglang-([^-]+)-", path.rsplit("/", 1)[-1]).group(1)
        for name in z.namelist():
            if name.startswith("sglang/srt/arg_groups/fields/") and name.endswith(".py"):
                tree = ast.parse(z.read(name))
                for node in ast.walk(tree):
                    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                        text = ast.unparse(node.annotation)
                        if not text.startswith(("A[", "Annotated[")) or "no_cli=True" in text:
                            continue
                        cli = re.search(r"cli_name=['\"]([^'\"]+)", text)
                        flags.add(cli.group(1) if cli else "--" + node.target.id.replace("_", "-"))
                        for alias in re.findall(r"aliases=\[([^\]]*)\]", text):
                            flags |= set(re.findall(r"['\"](-[^'\"]+)['\"]", alias))
                        listed = re.search(r"choices=\[([^\]]*)\]", text)
                        if listed and node.target.id == "kv_cache_dtype":
                            kv_choices = re.findall(r"['\"]([^'\"]+)['\"]", listed.group(1))
        flags |= _add_argument_flags(ast.parse(z.read("sglang/srt/server_args.py")))
        tree = ast.parse(z.read("sglang/srt/arg_groups/choices.py"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "QUANTIZATION_CHOICES" for t in node.targets):
                choices = _strings(node.value)
    return {"version": version, "source": "sglang/srt/arg_groups/fields/*.py (A[T, Arg(...)] fields -> --field-name and aliases), "
            "sglang/srt/server_args.py add_cli_args; sglang/srt/arg_groups/choices.py QUANTIZATION_CHOICES",
            "flags": sorted(flags), "quantization": sorted(set(choices)), "kv_cache_dtype": sorted(kv_choices)}


if __name__ == "__main__":
    print(json.dumps({"vllm": vllm(sys.argv[1]), "sglang": sglang(sys.argv[2])}, indent=1))
