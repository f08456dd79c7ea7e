"""One way to make a rich console for every command.

On a terminal rich fits its width. Written to a file or a pipe (a SLURM ``.out`` file, a
log, ``| tee``), rich assumes 80 columns: tables are cut (``gpt2-m…``) and messages
wrap mid-sentence. There the console is as wide as what it prints, at least
:data:`FILE_WIDTH` columns, whatever ``COLUMNS`` says (a shell that exports it passes its
terminal's width on to the pipe).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console, RenderableType

if TYPE_CHECKING:  # an annotation only: the commands that print no table skip its import
    from rich.table import Table

#: Columns of output that goes to a file or a pipe.
FILE_WIDTH = 200


def console(*, stderr: bool = False, fit: RenderableType | None = None, **kwargs: Any) -> Console:
    """A rich Console on stdout (or ``stderr``); off a terminal at least FILE_WIDTH
    columns wide, and wide enough for ``fit`` (a table's whole rows)."""
    made = Console(stderr=stderr, **kwargs)
    if made.is_terminal:
        return made
    width = FILE_WIDTH
    if fit is not None:
        width = max(width, Console(width=10_000).measure(fit).maximum)
    return Console(stderr=stderr, width=width, **kwargs)


def print_titled(table: Table, title: str) -> None:
    """``title`` on a line of its own, then ``table``: a table's own title wraps at the
    table's width (a checkpoint path cut as ``last.ck`` / ``pt``, a lone ``%``)."""
    out = console(fit=table)
    out.print(title, style="italic", soft_wrap=True, markup=False, highlight=False)
    out.print(table)
