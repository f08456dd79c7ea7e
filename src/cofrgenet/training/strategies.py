"""Distributed strategies configured for CoFrGeNet models."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.strategies import FSDPStrategy


class LadderFSDPStrategy(FSDPStrategy):
    """FSDP with ``use_orig_params=True`` as a named, YAML-checkable argument.

    Dyadic unfreezing toggles ``requires_grad`` per ladder depth; FSDP's flattened
    parameters allow mixed ``requires_grad`` only with ``use_orig_params=True``.
    (Lightning's FSDPStrategy forwards it through ``**kwargs``, which a config checker
    cannot see.)
    """

    def __init__(self, use_orig_params: bool = True, **kwargs: Any) -> None:
        super().__init__(use_orig_params=use_orig_params, **kwargs)
