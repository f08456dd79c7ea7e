"""Lazy package exports: ``from cofrgenet.models import GPT`` imports only what it names.

A package lists ``name -> submodule`` and sets ``__getattr__ = lazy_exports(__name__,
EXPORTS, globals())`` (PEP 562): a name is imported from its submodule the first time it
is asked for, then kept in the package, so importing the package costs nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package`` for ``exports`` (name -> submodule)."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    return __getattr__
