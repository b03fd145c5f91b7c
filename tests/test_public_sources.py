"""Every source perfguide cites is one a user can read: no Decision, no string in the package and no docs page
points at a file that does not ship (the project's private notes: rules.md, anchors.md, fake-tracing.md, design.md,
user-needs.md, anything under ../shared)."""

from __future__ import annotations

from pathlib import Path

import pytest

try:
    from helpers import hardware
except ImportError:  # pragma: no cover - run from the repository root
    from tests.helpers import hardware

import perfguide

ROOT = Path(perfguide.__file__).resolve().parents[1]
PRIVATE = ("rules.md", "anchors.md", "fake-tracing.md", "design.md", "user-needs.md", "shared/reference", "shared/groundtruth", "../shared")
TEXT = (".py", ".json", ".md", ".yaml", ".yml", ".toml", ".txt")


def private_citations(text: str) -> list[str]:
    return [name for name in PRIVATE if name in text]


def shipped_and_documented() -> list[Path]:
    files = [p for p in (ROOT / "perfguide").rglob("*") if p.suffix in TEXT]
    return sorted(files + list((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"])


def test_the_scan_reads_the_package_and_the_docs() -> None:
    files = {p.relative_to(ROOT).as_posix() for p in shipped_and_documented()}
    assert {"perfguide/scenarios/host.py", "perfguide/data/efficiency.json", "docs/concepts.md"} <= files
    assert private_citations("see rules.md 3.2 and ../shared/design.md") == ["rules.md", "design.md", "../shared"]


@pytest.mark.parametrize("path", shipped_and_documented(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_file_cites_a_private_note(path: Path) -> None:
    found = private_citations(path.read_text(encoding="utf-8"))
    assert not found, f"{path.relative_to(ROOT)} cites {found}; cite the public page or code it paraphrases"


CALLS = [
    ("meta-llama/Llama-2-7b-hf", "train_gpu_one", "a100-80gb", {}),
    ("meta-llama/Llama-2-7b-hf", "train_gpu_one", "t4", {}),
    ("meta-llama/Llama-2-7b-hf", "train_gpu_one", "h100-80gb", {"finetune": "lora"}),
    ("openai-community/gpt2", "train_gpu_one", "v100-16gb", {}),
    ("meta-llama/Llama-2-7b-hf", "train_gpu_many", "a100-80gb:8", {}),
    ("meta-llama/Llama-2-70b-hf", "train_gpu_many", "h100-80gb:8x2", {}),
    ("openai-community/gpt2", "train_cpu", None, {}),
    ("meta-llama/Llama-2-7b-hf", "infer_gpu_one", "t4", {}),
    ("meta-llama/Llama-2-70b-hf", "infer_gpu_one", "a100-80gb", {}),
    ("meta-llama/Llama-2-70b-hf", "infer_gpu_many", "a100-80gb:4", {}),
    ("openai-community/gpt2", "infer_cpu", None, {}),
]


@pytest.mark.parametrize("model,scenario,hw,constraints", CALLS, ids=lambda v: v if isinstance(v, str) else None)
def test_every_decision_cites_a_public_source(model: str, scenario: str, hw: str | None, constraints: dict) -> None:
    target = hardware("cpu") if hw is None else hw
    rec = perfguide.recommend(model, scenario, hardware=target, **constraints)
    assert rec.decisions, "a plan without decisions would pass this test by saying nothing"
    bad = [(d.setting, d.source) for d in rec.decisions if d.source and private_citations(d.source)]
    assert not bad, f"{scenario} on {hw}: decisions cite private notes: {bad}"
