"""The package's layers form a DAG: every module sits in one layer, and no import statement (module level or
inside a function body, relative or absolute) names a module of a higher layer. Parsed with ast, so a lazy
``from ..scenarios import x`` inside a function counts exactly like a top-level one. The checker is run on
planted violations too, so it cannot pass by looking at nothing.

The order (lowest first) is the design's (docs/architecture.md): the vocabulary, hardware and model, the memory
and speed primitives, the techniques, the cost-model fold over the techniques' hooks, the serving engines,
planning, the adapters / renderers / measurement, and the public face.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "perfguide"

#: (layer, members). A member is a module path relative to the package without ``.py`` ("memory/analytic"), or
#: a folder ending in "/" (every module below it). The most specific member wins: a module named exactly,
#: then the longest folder; so the fold modules of memory/ and speed/ sit above the rest of their folders.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("vocabulary", ("_base", "_cache", "_data", "_files", "_interrupt", "_packages", "_serving_data", "_text",
                    "_version", "decisions", "errors", "optimizer_facts", "setup", "sources", "data/")),
    ("hardware and model", ("hardware/", "model/")),
    ("memory and speed primitives", ("memory/", "speed/")),
    ("techniques", ("techniques/",)),
    ("cost-model fold", ("memory/__init__", "memory/analytic", "memory/trace", "memory/tracing/",
                         "speed/__init__", "speed/training", "speed/terms", "speed/dequant", "speed/inference",
                         "speed/sequence_split")),
    ("engines", ("engines/",)),
    ("planning", ("scenarios/",)),
    ("adapters, render, measure", ("integrations/", "render/", "measure/")),
    ("public face", ("__init__", "__main__", "api", "recommendation", "preflight", "cli", "cli_flags", "cli_recommend", "cli_calibrate", "cli_check")),
)

#: The one type-only reference upward: adapters, renderers and measurement are handed the public Recommendation
#: (the plan plus its delegating methods) and name it in annotations under ``if TYPE_CHECKING`` (never run).
TYPE_ONLY_UPWARD = frozenset({"recommendation"})


def relative(path: Path, root: Path) -> str:
    """'memory/analytic' for perfguide/memory/analytic.py, 'memory/__init__' for the package itself."""
    return path.relative_to(root).with_suffix("").as_posix()


def layer_of(rel: str, layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> int | None:
    """Index of the layer holding module ``rel`` (None: no layer names it)."""
    best: tuple[int, int] | None = None      # (specificity, layer)
    for index, (_, members) in enumerate(layers):
        for m in members:
            if m == rel:
                specificity = 10_000
            elif m.endswith("/") and rel.startswith(m):
                specificity = len(m)
            else:
                continue
            if best is None or specificity > best[0]:
                best = (specificity, index)
    return None if best is None else best[1]


def resolve(dotted: str, root: Path) -> str | None:
    """The module file a dotted name inside the package lands on ('perfguide.memory.sharding.PerDevice' ->
    'memory/sharding'); None outside the package."""
    parts = dotted.split(".")
    if parts[0] != root.name:
        return None
    parts = parts[1:]
    while parts:
        base = root.joinpath(*parts)
        if base.with_suffix(".py").is_file():
            return "/".join(parts)
        if (base / "__init__.py").is_file():
            return "/".join([*parts, "__init__"])
        parts = parts[:-1]
    return "__init__"


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _type_checking_imports(tree: ast.Module) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:`` (annotations only: they never run)."""
    return {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node)
            for stmt in node.body for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom))}


def _runtime_module_level(tree: ast.Module) -> list[ast.AST]:
    """The statements that run when the module is imported: not in functions, not under ``if TYPE_CHECKING``."""
    todo: list[ast.stmt] = list(tree.body)
    out: list[ast.AST] = []
    while todo:
        stmt = todo.pop()
        if isinstance(stmt, ast.If):
            todo += [] if _is_type_checking(stmt) else [*stmt.body, *stmt.orelse]
        elif isinstance(stmt, ast.Try):
            todo += [*stmt.body, *stmt.orelse, *stmt.finalbody, *(s for h in stmt.handlers for s in h.body)]
        else:
            out.append(stmt)
    return out


def imports(path: Path, root: Path, *, module_level_runtime: bool = False) -> list[tuple[int, str, bool]]:
    """(line, module file, type-only) of every package module an import statement in ``path`` names, relative
    imports resolved; ``from pkg import name`` lands on ``pkg/name`` when that is a module. With
    ``module_level_runtime``, only the imports that run when the module itself is imported."""
    rel = relative(path, root)
    package = rel.split("/")[:-1]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = _type_checking_imports(tree)
    nodes = _runtime_module_level(tree) if module_level_runtime else list(ast.walk(tree))
    out: list[tuple[int, str, bool]] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            out += [(node.lineno, r, id(node) in typing_only) for a in node.names if (r := resolve(a.name, root))]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join([root.name, *base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for a in node.names:
                r = resolve(f"{target}.{a.name}", root)
                if r is not None:
                    out.append((node.lineno, r, id(node) in typing_only))
    return out


def modules(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py"))


def violations(root: Path, layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> list[str]:
    """Every module no layer names, every import against the order, and every package whose ``__init__`` runs
    an import above one of its own modules (importing that module would run it first: a loop at import time)."""
    found: list[str] = []
    for path in modules(root):
        rel = relative(path, root)
        mine = layer_of(rel, layers)
        if mine is None:
            found.append(f"{rel}: in no layer (add it to LAYERS)")
            continue
        for line, target, type_only in imports(path, root):
            theirs = layer_of(target, layers)
            if theirs is not None and theirs > mine and not (type_only and target in TYPE_ONLY_UPWARD):
                found.append(f"{rel} line {line} imports {target} ({layers[theirs][0]}) from {layers[mine][0]}")
        if path.name == "__init__.py" and path.parent != root:
            lowest = min((layer_of(relative(p, root), layers) or 0) for p in modules(path.parent))
            for line, target, _ in imports(path, root, module_level_runtime=True):
                theirs = layer_of(target, layers)
                if theirs is not None and theirs > lowest:
                    found.append(f"{rel} line {line} runs an import of {target} ({layers[theirs][0]}) above its "
                                 f"package's {layers[lowest][0]} modules")
    return found


def test_every_layer_names_existing_modules():
    """Guard against the test passing because a layer looks in the wrong place (engines/ included)."""
    rels = [relative(p, PACKAGE) for p in modules(PACKAGE)]
    for name, members in LAYERS:
        for m in members:
            assert any(r == m or (m.endswith("/") and r.startswith(m)) for r in rels), f"{name}: {m} matches no module"


def test_the_layers_form_a_dag():
    bad = violations(PACKAGE)
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def _plant(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "perfguide"
    for rel, text in files.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return pkg


CLEAN = {
    "__init__.py": "from .api import recommend\n",
    "api.py": "from .scenarios import plan\n\ndef recommend():\n    return plan()\n",
    "setup.py": "", "errors.py": "",
    "hardware/__init__.py": "", "hardware/types.py": "from ..setup import x\n",
    "memory/__init__.py": "from .sharding import PerDevice\n\ndef estimate_memory():\n    from .analytic import fold\n",
    "memory/sharding.py": "from ..hardware.types import GPU\n",
    "memory/analytic.py": "from .. import techniques\n",
    "speed/__init__.py": "", "speed/rates.py": "from ..memory.sharding import PerDevice\n",
    "speed/training.py": "from ..techniques import step_seconds\nfrom .rates import gemm\n",
    "techniques/__init__.py": "from .base import Technique\n",
    "techniques/base.py": "from ..speed.rates import gemm\n",
    "engines/__init__.py": "", "engines/vllm.py": "from ..speed.training import training_speed\n",
    "scenarios/__init__.py": "", "scenarios/plan.py": "from ..engines import vllm\nfrom perfguide.memory import estimate_memory\n",
}


def test_the_checker_passes_a_clean_tree(tmp_path: Path) -> None:
    assert violations(_plant(tmp_path, CLEAN)) == []


@pytest.mark.parametrize(("rel", "text", "expected"), [
    # a lazy relative import inside a function, from a primitive into the techniques (the old speed<->techniques loop)
    ("speed/rates.py", "def f():\n    from ..techniques import kernel_factors\n", "speed/rates line 2 imports techniques/__init__"),
    # a technique reaching the fold through `from .. import` (a module named as a name)
    ("techniques/base.py", "def f():\n    from ..speed import training\n", "techniques/base line 2 imports speed/training"),
    # an absolute import, from the lowest layers into planning
    ("hardware/types.py", "import perfguide.scenarios.plan\n", "hardware/types line 1 imports scenarios/plan"),
    # an engine importing planning
    ("engines/vllm.py", "from ..scenarios.plan import x\n", "engines/vllm line 1 imports scenarios/plan"),
    # a package __init__ that runs the fold when a primitive of its package is imported
    ("memory/__init__.py", "from .analytic import fold\n", "memory/__init__ line 1 runs an import of memory/analytic"),
    # a module no layer names
    ("stray.py", "", "stray: in no layer"),
])
def test_the_checker_finds_planted_violations(tmp_path: Path, rel: str, text: str, expected: str) -> None:
    found = violations(_plant(tmp_path, {**CLEAN, rel: text}))
    assert any(v.startswith(expected) for v in found), found
