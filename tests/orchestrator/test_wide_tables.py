"""Wide tables are paged on a terminal and folded elsewhere, never crushed."""

from __future__ import annotations

import io

from rich.console import Console
from rich.pager import Pager
from rich.table import Table
from rich.text import Text

from scalelab.cli.wide_tables import print_table

HEADERS = [f"setting_{i}" for i in range(12)]


def _table(columns: int = len(HEADERS)) -> Table:
    table = Table(title="sweep x", caption="3 rows")
    for header in HEADERS[:columns]:
        table.add_column(header)
    for r in range(3):
        table.add_row(*[f"value-{r}-{i}" for i in range(columns)])
    return table


class Recorder(Pager):
    def __init__(self) -> None:
        self.pages: list[str] = []

    def show(self, content: str) -> None:
        self.pages.append(content)


def test_a_wide_table_is_folded_into_parts_that_fit_when_not_a_terminal():
    buf = io.StringIO()
    print_table(Console(file=buf, width=80), _table())
    text = buf.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    for i, header in enumerate(HEADERS):
        assert f" {header} " in text and f" value-2-{i} " in text  # whole, not 'set…'
    parts = text.count("setting_0 ")
    assert parts >= 2 and text.count("value-1-0 ") == parts  # the key column in every part
    assert text.count("sweep x") == 1 and text.count("3 rows") == 1


def test_a_folded_tables_caption_reads_at_the_screens_width():
    """The caption comes under the parts on lines as wide as the screen allows, not wrapped
    in the last part's width (a part may be one narrow column)."""
    caption = (
        "to run: 4 trials, 2.019e+11 FLOPs, ~0.000862 CPU-hours at the CPU rate below; finished: 0"
    )
    table = _table()
    table.caption = caption
    buf = io.StringIO()
    print_table(Console(file=buf, width=100), table)
    assert caption in buf.getvalue()  # on one line


def test_a_wide_table_is_paged_at_its_natural_width_on_a_terminal():
    buf, pager = io.StringIO(), Recorder()
    console = Console(file=buf, width=80, force_terminal=True)
    print_table(console, _table(), pager=pager)
    (page,) = pager.pages
    assert buf.getvalue() == ""  # all of it went to the pager
    plain = Text.from_ansi(page).plain  # with its colours
    assert max(len(line) for line in plain.splitlines()) > 80
    assert all(f" {header} " in plain for header in HEADERS) and plain.count("setting_0") == 1


def test_a_table_that_fits_is_printed_as_it_is():
    buf, pager = io.StringIO(), Recorder()
    print_table(Console(file=buf, width=80, force_terminal=True), _table(3), pager=pager)
    assert not pager.pages and buf.getvalue().count("setting_0") == 1
