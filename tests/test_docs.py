"""Executes the examples in docs/ so that they cannot rot.

Conventions for everything under docs/ (authors: follow these, the test enforces them):

1. A ```python block that contains ``>>>`` is a doctest. All such blocks of one page run in order in one
   namespace (a later block may use ``rec`` from an earlier one). Shown output is compared by doctest with
   ELLIPSIS and NORMALIZE_WHITESPACE, so a shown value (chosen optimizer, micro-batch, strategy...) that no
   longer matches fails the test. Use ``...`` to elide parts of long output.
2. A ```python block without ``>>>`` is an illustration (e.g. a train.py skeleton that needs a GPU): it is
   compiled, never run.
3. A ```console block runs each ``$ perfguide ...`` line through ``perfguide.cli.main(argv)`` in this process
   (exit status must be 0). Every other non-empty line of the block is shown output: it must appear in the
   command's stdout, in the same order, verbatim (trailing spaces ignored); a line ``...`` marks omitted lines.
4. ```text / ```bash / ```json / ```yaml blocks are not executed.
5. Relative links between docs and to repository files (bench/results/...) must point to existing files.
6. docs/validation.md quotes the summary row of bench/results/accuracy.md; the quoted numbers must match it.

After a deliberate change of the cost model or a bench rerun, ``python tests/test_docs.py --update`` rewrites the
shown output (doctest results, console lines, the validation numbers) from the current code; review ``git diff docs/``.

Examples use named hardware ("a100-80gb", "l4:8", "cpu") and offline catalog models, never the probe, so the
output does not depend on the machine the test runs on. HF_HUB_OFFLINE=1 is set for every test here.
"""

from __future__ import annotations

import doctest
import importlib.util
import io
import os
import re
import shlex
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
#: Pages whose examples need a scenario module that is still being written elsewhere in the project.
NEEDS_MODULE = {"train_gpu_many.md": "perfguide.scenarios.train_gpu_many"}


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Examples never reach the Hub; set per test so other test modules keep their own environment."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@dataclass(frozen=True)
class Block:
    page: Path
    lang: str
    text: str
    line: int  # 1-based line of the opening fence


def blocks(page: Path) -> list[Block]:
    source = page.read_text(encoding="utf-8")
    return [Block(page, m.group(1), m.group(2), source.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(source)]


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(DOCS)) for p in paths]


def _skip_unfinished(page: Path) -> None:
    module = NEEDS_MODULE.get(page.name)
    if module and importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} does not exist yet; its page's examples run once it does")


def test_docs_exist() -> None:
    """The pages the documentation promises (index, concepts, six scenarios, CLI, API, validation, FAQ)."""
    expected = ["index.md", "concepts.md", "cli.md", "api.md", "validation.md", "faq.md"]
    expected += [f"scenarios/{s}.md" for s in ("train_gpu_one", "train_gpu_many", "train_cpu",
                                                 "infer_gpu_one", "infer_gpu_many", "infer_cpu")]
    missing = [p for p in expected if not (DOCS / p).is_file()]
    assert not missing, f"missing docs pages: {missing}"


# --- 1. and 2.: python blocks ---------------------------------------------------------------------

@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_python_examples(page: Path) -> None:
    py = [b for b in blocks(page) if b.lang == "python"]
    for b in py:
        if ">>>" not in b.text:
            compile(b.text, f"{page.name}:{b.line}", "exec")
    runnable = [b for b in py if ">>>" in b.text]
    if not runnable:
        return
    _skip_unfinished(page)
    parser = doctest.DocTestParser()
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    globs: dict[str, object] = {"__name__": "__docs__"}
    for b in runnable:
        test = parser.get_doctest(b.text, globs, f"{page.relative_to(DOCS)}:{b.line}", str(page), b.line)
        out = io.StringIO()
        result = runner.run(test, out=out.write, clear_globs=False)
        globs.update(test.globs)  # DocTest copies its globals: carry names over to the page's next block
        assert result.failed == 0, f"{page.relative_to(DOCS)} block at line {b.line}:\n{out.getvalue()}"


# --- 3.: console blocks ----------------------------------------------------------------------------

def _commands(text: str) -> list[tuple[list[str], list[str]]]:
    """[(argv, expected lines)] for each ``$ perfguide`` line and the output lines under it."""
    out: list[tuple[list[str], list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            argv = shlex.split(line[2:], comments=True)
            assert argv and argv[0] == "perfguide", f"console blocks may only run perfguide, got {line!r}"
            out.append((argv[1:], []))
        elif out and line.strip() and line.strip() != "...":
            out[-1][1].append(line.rstrip())
    return out


def _run_cli(argv: list[str]) -> tuple[int, str, str]:
    from perfguide.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with redirect_stdout(stdout), redirect_stderr(stderr):
        code = main(argv)
    return code, stdout.getvalue(), stderr.getvalue()


def _missing_in_order(expected: list[str], actual: str) -> str | None:
    lines = [a.rstrip() for a in actual.splitlines()]
    pos = 0
    for want in expected:
        try:
            pos = lines.index(want, pos) + 1
        except ValueError:
            return want
    return None


CONSOLE = [(page, b) for page in PAGES for b in blocks(page) if b.lang == "console"]


@pytest.mark.parametrize(("page", "block"), CONSOLE, ids=[f"{p.relative_to(DOCS)}:{b.line}" for p, b in CONSOLE])
def test_console_examples(page: Path, block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _skip_unfinished(page)
    monkeypatch.chdir(tmp_path)  # --plot / --write-accelerate-config examples write here, not into the repo
    for argv, expected in _commands(block.text):
        code, stdout, stderr = _run_cli(argv)
        where = f"{page.relative_to(DOCS)}:{block.line} `perfguide {' '.join(argv)}`"
        assert code == 0, f"{where} exited {code}: {stderr}"
        missing = _missing_in_order(expected, stdout)
        assert missing is None, f"{where}: shown line not in the real output (or out of order):\n{missing!r}\n--- real output ---\n{stdout}"


# --- 5.: links -------------------------------------------------------------------------------------

@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_relative_links_resolve(page: Path) -> None:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    broken = [t for t in LINK.findall(text) if "://" not in t and not (page.parent / t).exists()]
    assert not broken, f"{page.relative_to(DOCS)} links to missing files: {broken}"


# --- 6.: validation numbers ------------------------------------------------------------------------

def bench_summary() -> dict[str, str]:
    """The numbers docs/validation.md quotes, read from the ALL row of bench/results/accuracy.md."""
    bench = (ROOT / "bench" / "results" / "accuracy.md").read_text(encoding="utf-8")
    row = next(line for line in bench.splitlines() if line.startswith("| ALL |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    out = {"rows": cells[1], "median": cells[2], "p90": cells[3], "accelerate median": cells[4], "deepspeed median": cells[6]}
    verdicts = re.search(r"verdicts \(OOM, max-batch and max-context rows\): (\d+/\d+) correct", bench)
    if verdicts:
        out["verdicts"] = verdicts.group(1)
    return out


VALIDATION_ROW = re.compile(r"^\| (\d+) \| ([\d.]+%) \| ([\d.]+%) \| (\d+/\d+) \|$", re.MULTILINE)
ANCHORS = re.compile(r"median error of ([\d.]+%) and DeepSpeed's model-states\nformula ([\d.]+%)")


def test_validation_quotes_current_bench_summary() -> None:
    page = (DOCS / "validation.md").read_text(encoding="utf-8")
    stale = {k: v for k, v in bench_summary().items() if v not in page}
    assert not stale, (f"docs/validation.md no longer matches bench/results/accuracy.md; current values: {stale} "
                       "(python tests/test_docs.py --update rewrites them)")


def _update_validation(source: str) -> str:
    s = bench_summary()
    source = VALIDATION_ROW.sub(f"| {s['rows']} | {s['median']} | {s['p90']} | {s.get('verdicts', '-')} |", source, count=1)
    return ANCHORS.sub(f"median error of {s['accelerate median']} and DeepSpeed's model-states\nformula {s['deepspeed median']}",
                       source, count=1)


# --- regenerating shown output after a deliberate change of the cost model ---------------------------

class _Collect(doctest.DocTestRunner):
    """Records (example, actual output) for every example whose output differs."""

    def __init__(self) -> None:
        super().__init__(optionflags=FLAGS)
        self.fixes: list[tuple[doctest.Example, str]] = []

    def report_failure(self, out, test, example, got):
        self.fixes.append((example, got))


def _update_python(page: Path) -> str:
    source = page.read_text(encoding="utf-8")
    parser, runner, globs = doctest.DocTestParser(), _Collect(), {"__name__": "__docs__"}
    for b in (b for b in blocks(page) if b.lang == "python" and ">>>" in b.text):
        test = parser.get_doctest(b.text, globs, page.name, str(page), b.line)
        runner.run(test, out=lambda _s: None, clear_globs=False)
        globs.update(test.globs)
    for example, got in runner.fixes:
        if example.want and "..." not in example.want:
            source = source.replace(example.want, got, 1)
    return source


def _key(line: str) -> str:
    """What identifies a shown line across regenerations: its text before the first number or bar glyph."""
    return re.split(r"[\d\u2580-\u259f\u25b6]", line, maxsplit=1)[0]


def _update_console(source: str, page: Path) -> str:
    """A shown line that vanished is replaced by the next real line (in order) with the same key."""
    for b in (b for b in blocks(page) if b.lang == "console"):
        for argv, expected in _commands(b.text):
            real = [r.rstrip() for r in _run_cli(argv)[1].splitlines()]
            pos = 0
            for want in expected:
                if want in real[pos:]:
                    pos = real.index(want, pos) + 1
                    continue
                hit = next((i for i in range(pos, len(real)) if _key(real[i]) == _key(want)), None)
                if hit is not None:
                    source, pos = source.replace(want, real[hit], 1), hit + 1
    return source


if __name__ == "__main__":  # python tests/test_docs.py --update: rewrite shown output from the current code
    import sys
    import tempfile

    os.environ["HF_HUB_OFFLINE"] = "1"

    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python tests/test_docs.py --update   (then review `git diff docs/`)")
    os.chdir(tempfile.mkdtemp(prefix="perfguide-docs-"))  # as in test_console_examples: files the examples write stay out of the repo
    for page in PAGES:
        before = page.read_text(encoding="utf-8")
        updated = _update_console(_update_python(page), page)
        page.write_text(_update_validation(updated) if page.name == "validation.md" else updated, encoding="utf-8")
        if page.read_text(encoding="utf-8") != before:
            print(f"updated {page.relative_to(ROOT)}")
