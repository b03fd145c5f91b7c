"""The README and the reference lists in docs/ cannot drift from the code and the data.

* the README's Python snippet is a complete script: it runs, as written, on a tiny local model on CPU (only the
  model name, the scenario/hardware and the sequence length are swapped, each of which must appear exactly once);
* the README's main-job command parses with the real CLI parser;
* the catalog size, the named GPUs and node types, the scenarios, the CLI flags and the benchmark scripts the docs
  list are the ones the code and data have.
"""

from __future__ import annotations

import csv
import re
import shlex
from pathlib import Path

import pytest
from helpers import tiny_config, tiny_tokenizer

from perfguide.cli import build_parser
from perfguide.hardware import specs
from perfguide.model import catalog
from perfguide.scenarios import registry

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
CLI_MD = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
CLI_MD_FLAT = " ".join(CLI_MD.split())
INDEX_MD = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")


def fenced(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def test_readme_snippet_is_a_complete_script_that_trains(tmp_path, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM

    snippet = fenced(README, "python")[0]
    model_dir = tmp_path / "tiny"
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(tiny_config()).save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    swaps = {'name = "meta-llama/Llama-3.1-8B"': f"name = {str(model_dir)!r}",
             'scenario="train_gpu_one", hardware="a100-80gb"': 'scenario="train_cpu", hardware="cpu"',
             "seq_len=2048": "seq_len=32"}
    for old, new in swaps.items():
        assert snippet.count(old) == 1, old
        snippet = snippet.replace(old, new)
    # a complete script: everything it uses is imported or defined in it (run in an empty namespace)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__main__"}
    exec(compile(snippet, "README.md", "exec"), namespace)
    assert (tmp_path / "out").is_dir()
    lines = snippet.splitlines()
    args_at = next(i for i, line in enumerate(lines) if "rec.training_args(" in line)
    load_at = next(i for i, line in enumerate(lines) if ".from_pretrained(name, **rec.model_kwargs())" in line)
    assert args_at < load_at, "TrainingArguments must come before from_pretrained (ZeRO-3)"


def test_readme_main_job_parses_with_the_real_cli():
    command = next(line for block in fenced(README, "bash") for line in block.splitlines() if "perfguide recommend" in line)
    argv = shlex.split(command.split(".venv/bin/perfguide ", 1)[1])
    args = build_parser().parse_args(argv)
    assert args.model == "meta-llama/Llama-3.1-8B" and args.hardware == "a100-80gb"


def test_readme_states_the_catalog_size():
    match = re.search(r"offline catalog of (\d+) popular checkpoints", README)
    assert match is not None
    assert int(match[1]) == len(catalog.catalog_names())


def test_readme_states_the_measurement_count():
    with (ROOT / "bench" / "data" / "published_measurements.csv").open(encoding="utf-8") as f:
        rows = sum(1 for _ in csv.DictReader(f))
    assert f"vs {rows} published measurements" in README


def _listed(text: str, start: str, end: str) -> list[str]:
    part = text[text.index(start) + len(start):]
    return re.findall(r"`([^`]+)`", part[: part.index(end)])


def test_cli_md_lists_every_named_gpu_and_node_type():
    assert _listed(CLI_MD_FLAT, f"Named GPUs ({len(specs.canonical_names())}):", "; node types") == specs.canonical_names()
    assert _listed(CLI_MD_FLAT, f"node types ({len(specs.node_names())}, their GPUs on the host they ship with):", "; and `cpu`") == specs.node_names()


def test_every_recommend_flag_is_documented():
    sub = build_parser()._subparsers._group_actions[0].choices["recommend"]   # type: ignore[union-attr]
    flags = {o for a in sub._actions for o in a.option_strings if o.startswith("--") and not o.startswith("--no-")}
    missing = sorted(f for f in flags - {"--help", "--verbose"} if not re.search(re.escape(f) + r"(?![\w-])", CLI_MD))
    assert not missing, f"docs/cli.md does not mention {missing}"


@pytest.mark.parametrize("text", [README, CLI_MD, INDEX_MD], ids=["README", "cli.md", "index.md"])
def test_every_scenario_is_listed(text):
    missing = [name for name in registry.names() if f"`{name}`" not in text]
    assert not missing


def test_every_bench_result_has_its_command_in_the_readme():
    listed = set(re.findall(r"bench/(\w+)\.py", README))
    for result in sorted((ROOT / "bench" / "results").glob("*.md")):
        writers = {p.stem for p in (ROOT / "bench").glob("*.py") if f"{result.stem}.md" in p.read_text(encoding="utf-8")}
        assert writers & listed, f"bench/results/{result.name} is written by {sorted(writers)}, none of which the README lists"
    for name in listed:
        assert (ROOT / "bench" / f"{name}.py").is_file(), name
