"""Output written to a file or a pipe is not squeezed into rich's 80 columns."""

from __future__ import annotations

from rich.table import Table

from cofrgenet import terminal


def test_off_a_terminal_the_console_is_wide_enough_for_whole_rows(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert not terminal.console().is_terminal  # pytest captures the output
    assert terminal.console().width == terminal.FILE_WIDTH
    table = Table()
    table.add_column("preset")
    table.add_row("x" * 300)
    assert terminal.console(fit=table).width >= 300
    monkeypatch.setenv("COLUMNS", "80")  # a shell's terminal width, passed on to a pipe
    assert terminal.console().width == terminal.FILE_WIDTH


def test_a_table_title_wider_than_its_table_stays_on_one_line(capsys):
    """`cofr eval`'s title cut the checkpoint path as `last.ck` / `pt` at the table's
    width; GLUE's put its `%` alone on a second line."""
    table = Table()
    table.add_column("task")
    table.add_row("ptb")
    title = "runs/mine/first/checkpoints/last.ckpt (step 20, test), the tasks' test splits"
    terminal.print_titled(table, title)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == title and "ptb" in "".join(lines[1:])
