"""Dotted keys (``trainer.max_steps``) into nested mappings: the one reading of them for
config files, sweep settings and the command line's key checks.

A key names a path through dicts; a list, a scalar or an empty mapping is a leaf. Light
(no import beyond the standard library), so ``cofr --help`` paths may use it.
"""

from __future__ import annotations

import copy
from typing import Any

from cofrgenet.errors import ConfigError


def get_dotted(config: Any, key: str, default: Any = None) -> Any:
    """The value at ``key`` (``a.b.c``) of nested dicts ``config``, or ``default`` where
    a part of the path is missing or not a mapping."""
    node = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def set_dotted(
    config: dict[str, Any], key: str, value: Any, error: type[Exception] = ConfigError
) -> None:
    """Set ``key`` (``a.b.c``) of ``config`` to a copy of ``value``, making the mappings
    on its path; ``error`` (the caller's kind of user error) where a part of the path
    holds something other than a mapping."""
    node = config
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise error(f"cannot set {key}: {part} is not a mapping in the config")
        node = child
    node[parts[-1]] = copy.deepcopy(value)


def dotted_leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    """{dotted path: value} of the leaves of nested mappings (lists are leaves), each
    path after ``prefix``."""
    if not isinstance(node, dict) or not node:
        return {prefix: node} if prefix else {}
    leaves: dict[str, Any] = {}
    for key, value in node.items():
        leaves.update(dotted_leaves(value, f"{prefix}.{key}" if prefix else str(key)))
    return leaves
