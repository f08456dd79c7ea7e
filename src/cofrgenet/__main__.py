"""``python -m cofrgenet ...``: the same as ``cofr ...``."""

from cofrgenet.cli import entry

entry()
