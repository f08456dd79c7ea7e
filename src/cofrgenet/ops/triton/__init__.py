"""Fused Triton kernels of the continued-fraction ops (``impl="triton"``).

Importing this package imports ``triton``; ``cofrgenet.ops`` does so only when the
triton implementation is used. Kernels run on CUDA devices, or on CPU tensors under
Triton's interpreter (``TRITON_INTERPRET=1`` set before ``triton`` is imported).

* :mod:`.recurrence`: the continuant recurrence, clamp and gradients as ``@triton.jit``
  helpers;
* :mod:`.continued_fraction`: ``continued_fraction_fwd_kernel`` / ``_bwd_kernel``;
* :mod:`.ladder`: ``ladder_ensemble_fwd_kernel`` / ``_bwd_kernel`` (univariate ladders
  and the elementwise Cffn ensemble);
* :mod:`.runtime`: devices, block sizes, output buffers (and NaN poisoning for tests).
"""

from cofrgenet.ops.triton.continued_fraction import continued_fraction_bwd, continued_fraction_fwd
from cofrgenet.ops.triton.ladder import (
    ladder_ensemble_bwd,
    ladder_ensemble_fwd,
    univariate_ladder_bwd,
    univariate_ladder_fwd,
)
from cofrgenet.ops.triton.runtime import check_tensor, interpreted

__all__ = [
    "check_tensor",
    "continued_fraction_bwd",
    "continued_fraction_fwd",
    "interpreted",
    "ladder_ensemble_bwd",
    "ladder_ensemble_fwd",
    "univariate_ladder_bwd",
    "univariate_ladder_fwd",
]
