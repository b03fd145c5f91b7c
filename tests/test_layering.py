"""The cost model and the facts below it never reach up: no import (module level or inside a function) from
hardware/, model/, memory/, speed/, techniques/ into the layers that use them. Parsed with ast, so a lazy
``from ..calibrate import x`` inside a function body counts exactly like a top-level one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "perfguide"
LOWER = ("hardware", "model", "memory", "speed", "techniques")
UPPER = ("api", "recommendation", "scenarios", "integrations", "render", "cli", "cli_setup", "cli_calibrate", "calibrate", "measure")


def module_name(path: Path, root: Path = PACKAGE.parent) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, root: Path = PACKAGE.parent) -> list[tuple[int, str]]:
    """Every module an import statement in ``path`` names, relative imports resolved to absolute names."""
    here = module_name(path, root)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            out.append((node.lineno, target))
            out += [(node.lineno, f"{target}.{a.name}") for a in node.names]  # `from .. import calibrate`
    return out


def upper_target(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "perfguide" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in UPPER else None


def lower_files() -> list[Path]:
    return sorted(p for layer in LOWER for p in (PACKAGE / layer).rglob("*.py"))


def test_the_lower_layers_exist():
    """Guard against the test passing because it looks in the wrong place."""
    found = {p.relative_to(PACKAGE).parts[0] for p in lower_files()}
    assert {"hardware", "model", "memory", "speed"} <= found


@pytest.mark.parametrize("path", lower_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_upward_import(path):
    bad = [(line, mod) for line, mod in imported_modules(path) if upper_target(mod)]
    assert not bad, f"{path.relative_to(PACKAGE)} imports upward: " + ", ".join(f"line {n}: {m}" for n, m in bad)


def test_the_checker_sees_lazy_and_relative_imports(tmp_path):
    """The parser must catch what the rule forbids, or the test above could never fail."""
    fake = tmp_path / "perfguide" / "memory" / "probe.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("from .types import MemoryEstimate\n\ndef f():\n    from ..calibrate import apply_memory\n"
                    "    from .. import measure\n    import perfguide.api\n")
    found = {upper_target(m) for _, m in imported_modules(fake, tmp_path)} - {None}
    assert found == {"calibrate", "measure", "api"}
