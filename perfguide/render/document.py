"""A tiny document model (sections of fields, tables, bars, bullets) and its three renderings.

Reports are built once as a Document and then written as plain text (copy-paste into an issue, logs),
Markdown (notebooks, PR descriptions) or rich ANSI (terminals), so the three can never disagree on content.
"""

from __future__ import annotations

from dataclasses import dataclass
from io import StringIO

from .bars import DEFAULT_WIDTH, BarRow, text_bar_lines

RICH_WIDTH = 110


@dataclass(frozen=True)
class Fields:
    """``key: value`` pairs, the accelerate-env style users paste into issues."""

    rows: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Bars:
    rows: tuple[BarRow, ...]


@dataclass(frozen=True)
class Bullets:
    """Items with an indent level; with ``headed`` the level 0 items are emphasised as headings of those below."""

    items: tuple[tuple[int, str], ...]
    headed: bool = False


@dataclass(frozen=True)
class Code:
    """Lines to paste as they are (a shell command, a few lines of Python): never indented, never wrapped."""

    lines: tuple[str, ...]
    language: str = "text"


Block = Fields | Table | Bars | Bullets | Code


@dataclass(frozen=True)
class Section:
    title: str
    blocks: tuple[Block, ...]


@dataclass(frozen=True)
class Document:
    title: str
    sections: tuple[Section, ...]


# --- plain text -------------------------------------------------------------------------------

def _text_table(table: Table) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(table.headers, *table.rows)]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()

    return [line(table.headers), line(tuple("-" * w for w in widths)), *(line(r) for r in table.rows)]


def _text_block(block: Block) -> list[str]:
    if isinstance(block, Fields):
        return [f"- {k}: {v}" for k, v in block.rows]
    if isinstance(block, Table):
        return _text_table(block)
    if isinstance(block, Bars):
        return text_bar_lines(list(block.rows), DEFAULT_WIDTH)
    if isinstance(block, Code):
        return list(block.lines)
    return [f"{'  ' * level}- {text}" for level, text in block.items]


def to_text(doc: Document) -> str:
    lines = [doc.title, "=" * len(doc.title)]
    for section in doc.sections:
        lines += ["", section.title, "-" * len(section.title)]
        for block in section.blocks:
            lines += _text_block(block)
    return "\n".join(lines) + "\n"


# --- markdown ---------------------------------------------------------------------------------

def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_row(cells: tuple[str, ...]) -> str:
    return "| " + " | ".join(_md_cell(c) for c in cells) + " |"


def _md_table(table: Table) -> list[str]:
    return [_md_row(table.headers), "|" + "|".join("---" for _ in table.headers) + "|", *(_md_row(r) for r in table.rows)]


def _md_bullet(level: int, text: str, headed: bool) -> str:
    return f"{'  ' * level}- " + (f"**{text}**" if headed and level == 0 else text)


def _md_block(block: Block) -> list[str]:
    if isinstance(block, Fields):
        return [f"- **{k}**: {v}" for k, v in block.rows]
    if isinstance(block, Table):
        return _md_table(block)
    if isinstance(block, Bars):
        return ["```text", *text_bar_lines(list(block.rows), DEFAULT_WIDTH), "```"]
    if isinstance(block, Code):
        return [f"```{block.language}", *block.lines, "```"]
    return [_md_bullet(level, text, block.headed) for level, text in block.items]


def to_markdown(doc: Document) -> str:
    lines = [f"### {doc.title}"]
    for section in doc.sections:
        lines += ["", f"#### {section.title}", ""]
        for i, block in enumerate(section.blocks):
            lines += ([""] if i else []) + _md_block(block)
    return "\n".join(lines) + "\n"


# --- rich (ANSI) ------------------------------------------------------------------------------

def _rich_block(block: Block):  # noqa: ANN202 - returns a rich renderable; rich is imported lazily
    from rich import box
    from rich.bar import Bar
    from rich.table import Table as RichTable
    from rich.text import Text

    if isinstance(block, Fields):
        grid = RichTable.grid(padding=(0, 2))
        grid.add_column(style="bold cyan", no_wrap=True)
        grid.add_column()
        for key, value in block.rows:
            grid.add_row(Text(key), Text(value))
        return grid
    if isinstance(block, Table):
        table = RichTable(box=box.SIMPLE_HEAD, header_style="bold")
        for header in block.headers:
            table.add_column(header)
        for row in block.rows:
            table.add_row(*(Text(str(c)) for c in row))
        return table
    if isinstance(block, Bars):
        grid = RichTable.grid(padding=(0, 1))
        grid.add_column(no_wrap=True)
        grid.add_column(width=DEFAULT_WIDTH + 8)
        grid.add_column(justify="right", no_wrap=True)
        for bar_row in block.rows:
            color = "red" if bar_row.over else "green"
            bar = Bar(size=1.0, begin=0.0, end=min(bar_row.fraction, 1.0), width=DEFAULT_WIDTH + 8, color=color, bgcolor="grey23")
            grid.add_row(Text(bar_row.label), bar, Text(bar_row.text, style="red" if bar_row.over else ""))
        return grid
    if isinstance(block, Code):
        return Text("\n".join(block.lines), style="green", no_wrap=True, overflow="ignore")
    text = Text()
    for level, item in block.items:
        heading = block.headed and level == 0
        text.append(f"{'  ' * level}{'•' if heading else '-'} {item}\n", style="bold" if heading else "")
    text.rstrip()
    return text


def to_rich(doc: Document, width: int = RICH_WIDTH) -> str:
    """ANSI text: rendered into a string so callers decide where it goes (stdout, a log, a notebook)."""
    from rich.console import Console
    from rich.text import Text

    out = StringIO()
    console = Console(file=out, force_terminal=True, color_system="truecolor", width=width, highlight=False)
    console.rule(Text(doc.title, style="bold"))
    for section in doc.sections:
        console.print()
        console.print(Text(section.title, style="bold underline"))
        for block in section.blocks:   # code is soft-wrapped: the terminal folds it, a copy gets the line whole
            console.print(_rich_block(block), soft_wrap=isinstance(block, Code))
    return out.getvalue()


FORMATS = ("text", "rich", "markdown")


def render_document(doc: Document, fmt: str) -> str:
    """Dispatch on the format name; an unknown one is the caller's typo, so say which exist."""
    from ..errors import unknown_value

    writers = {"text": to_text, "rich": to_rich, "markdown": to_markdown}
    if fmt not in writers:
        raise unknown_value("report format", fmt, FORMATS)
    from .safe import clean_document

    return writers[fmt](clean_document(doc))
