"""Ladder parameters, one tensor per depth, and the base class of CoFrGeNet layers.

Each depth k = 1..d of a ladder ensemble is its own ``nn.Parameter``: the dyadic
schedule (spec section 4) freezes and releases depths independently through
``requires_grad``, which must be per-parameter for AdamW to give a frozen depth no
moments and no weight decay, and which keeps working under DDP/FSDP.

Every ladder layer shares three choices, documented with their evidence in
docs/layers.md:

* ``denominators``: "positive" (default) computes each partial denominator as
  a_k = floor + softplus(w_k . x + b_k), so every continuant is >= min(1, floor) and the
  ladder has no poles at all; "paper" is the paper's a_k = w_k . x + b_k with the final
  continuant clamped at eps.
* ``out_std``: the init std of the output projections of the blocks they replace; the
  models pass GPT-2's residual scaling 0.02 / sqrt(2 n_layer). Cffn's U and V start at
  it; CAttnM and CAttnU start with the gain of attention's two projections
  (:func:`attention_gain`), so every branch starts as small as the one it replaces.
* ``clip_outputs``: ladder outputs are clipped in eval mode to the range seen in
  training (:class:`OutputRange`, in the state dict), as the paper does at inference.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from torch import Tensor, nn

from cofrgenet.ops import (
    NEAR_POLE,
    LadderStats,
    check_ladder_options,
    pvariate_denominator_stats,
    pvariate_ladder,
)
from cofrgenet.ops.continuant import cast

#: Partial-denominator parametrisations (see the module docstring).
DENOMINATORS = ("positive", "paper")
#: Default floor of positive partial denominators: |f~| <= 2 and |d f~ / d a_k| <= 4.
DENOMINATOR_FLOOR = 0.5
#: Default spread of the linear part w . x + b at initialisation (for unit-variance input).
DENOMINATOR_STD = 0.5
#: Default initial ladder bias: the paper's a_k centred at +1 keeps K_d away from 0 at
#: init (spec section 6); positive denominators start at floor + softplus(1) ~ 1.8.
DENOMINATOR_OFFSET = 1.0
#: Without a ladder bias no offset is possible; a wider spread keeps most of the paper's
#: units off poles at init (0.4% clamped at d = 5 for std 1, 23% for std 0.02).
DENOMINATOR_STD_NO_BIAS = 1.0
#: Init std of output projections outside a model (GPT-2's 0.02).
OUT_STD = 0.02
#: Init std of the projections that feed a block's mixers (GPT-2's c_fc and c_attn).
INPUT_STD = 0.02


def attention_gain(dim: int, out_std: float) -> float:
    """Gain of softmax attention's two projections at init: W_V (std INPUT_STD) then W_O
    (std out_std), each of fan-in dim, scale a unit-variance input by this much. The
    ladder layers that replace attention start with the same gain, whatever carries it.
    """
    return out_std * INPUT_STD * dim


def check_denominators(denominators: str, floor: float) -> None:
    if denominators not in DENOMINATORS:
        raise ValueError(
            f"unknown denominators {denominators!r}; choose one of {DENOMINATORS} "
            "('positive': a_k = floor + softplus(w x + b), no poles; 'paper': a_k = w x + b)"
        )
    if not (isinstance(floor, (int, float)) and math.isfinite(floor) and floor > 0):
        raise ValueError(f"the denominator floor must be a finite positive number, got {floor!r}")


#: The stacks of :func:`reusing_stacked_weights` blocks: (LadderWeights, name) -> tensor.
_REUSED_STACKS: contextvars.ContextVar[dict[tuple[nn.Module, str], Tensor] | None] = (
    contextvars.ContextVar("cofrgenet_reused_ladder_stacks", default=None)
)


@contextlib.contextmanager
def reusing_stacked_weights() -> Iterator[None]:
    """A block of forwards that leave every parameter unchanged, such as generation.

    Inside it, without autograd, each :class:`LadderWeights` stacks its per-depth
    tensors once and reuses the stack: two cats fewer per ladder layer and forward,
    ~10% of a one-token decoding step of cofrgenet-f at gpt2-mini. A parameter changed
    inside the block is not seen by the layers that already stacked it. With autograd
    on, nothing is reused (a stack then belongs to one forward's graph).
    """
    token = _REUSED_STACKS.set({})
    try:
        yield
    finally:
        _REUSED_STACKS.reset(token)


def _stack_depths(per_depth: nn.ParameterList) -> Tensor:
    """torch.stack of the per-depth tensors, as one cat and a view.

    A one-token decoding step is bound by op dispatch (a few us an op): stack costs an
    unsqueeze per depth besides its cat, and indexing a ParameterList ~1 us a depth in
    Python, hence parameters(recurse=False). FSDP (``use_orig_params``) sets them as
    plain tensors while it recomputes a checkpointed block in backward, which
    ``parameters()`` does not list: then they are indexed.
    """
    tensors = tuple(per_depth.parameters(recurse=False))
    if len(tensors) != len(per_depth):
        tensors = tuple(per_depth)
    return torch.cat(tensors).view(len(tensors), *tensors[0].shape)


class LadderWeights(nn.Module):
    """Partial-denominator weights (and optional biases) of a ladder ensemble, per depth.

    ``weight[k-1]`` (shape ``weight_shape``) and ``bias[k-1]`` (shape ``bias_shape``) hold
    depth k. ``stacked_weight()`` returns them as one (d, *weight_shape) tensor.
    """

    def __init__(
        self,
        depth: int,
        weight_shape: tuple[int, ...],
        bias_shape: tuple[int, ...] | None = None,
    ) -> None:
        super().__init__()
        if depth < 1:
            raise ValueError(f"ladder depth must be >= 1 (partial denominators), got {depth}")
        self.depth = depth
        self.weight = nn.ParameterList(
            nn.Parameter(torch.empty(weight_shape)) for _ in range(depth)
        )
        self.bias = (
            None
            if bias_shape is None
            else nn.ParameterList(nn.Parameter(torch.empty(bias_shape)) for _ in range(depth))
        )

    @property
    def has_bias(self) -> bool:
        return self.bias is not None

    def reset_parameters(self, weight_std: float, offset: float = DENOMINATOR_OFFSET) -> None:
        for w in self.weight:
            nn.init.normal_(w, std=weight_std)
        for b in self.bias or ():
            nn.init.constant_(b, offset)

    def stacked_weight(self) -> Tensor:
        """(d, *weight_shape): depth k - 1 at index k - 1."""
        return self._stacked("weight", self.weight)

    def stacked_bias(self) -> Tensor | None:
        """(d, *bias_shape), or None without biases."""
        return None if self.bias is None else self._stacked("bias", self.bias)

    def _stacked(self, name: str, per_depth: nn.ParameterList) -> Tensor:
        if torch.compiler.is_compiling():  # a graph stacks once anyway; Dynamo skips here
            return _stack_depths(per_depth)
        reused = _REUSED_STACKS.get()
        if reused is None or torch.is_grad_enabled():
            return _stack_depths(per_depth)
        key = (self, name)
        if key not in reused:
            reused[key] = _stack_depths(per_depth)
        return reused[key]

    def parameters_by_depth(self) -> dict[int, list[nn.Parameter]]:
        """{k: [weight_k, bias_k]} for k = 1..d."""
        out: dict[int, list[nn.Parameter]] = {}
        for k, w in enumerate(self.weight, start=1):
            out[k] = [w] if self.bias is None else [w, self.bias[k - 1]]
        return out


def _at_least_float32(t: Tensor) -> Tensor:
    return t.float() if t.dtype.itemsize < 4 else t


class OutputRange(nn.Module):
    """Range of ladder outputs seen in training; a clip to it in eval mode.

    ``low`` / ``high`` (buffers of ``shape``, one entry per ladder, in the state dict) widen
    at once to every training batch's extremes and otherwise drift towards the recent
    batches' extremes by ``momentum`` per step, so extremes of early weights are forgotten
    while everything seen lately stays inside. Until a ladder has been seen, nothing is
    clipped. Under data parallelism the batch extremes are reduced over all ranks first.
    ``forward(z)`` records (training) or clips (eval) z: (..., *shape) and
    returns z; ``forward(z, length)`` uses the leading ``length`` entries of the last
    dimension (ladders tied to positions), ``forward(z, slice(a, b))`` entries a..b-1.
    """

    def __init__(self, shape: tuple[int, ...], momentum: float = 0.01) -> None:
        super().__init__()
        self.momentum = momentum
        # At least float32, whatever the default dtype (bf16-true builds models under a bf16
        # one) or a module cast: in bf16 a step's drift, momentum x the gap, mostly rounds
        # away, and the range would never forget.
        self.register_buffer("low", _at_least_float32(torch.full(shape, float("-inf"))))
        self.register_buffer("high", _at_least_float32(torch.full(shape, float("inf"))))
        #: Whether a training forward records its batch (off while activation
        #: checkpointing replays a forward in backward: :func:`recording_paused`).
        self.recording = True

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> OutputRange:
        # Module.to(dtype), .half() and .bfloat16() come here: follow device moves and
        # float64, not a cast to 16 bits.
        low, high = self.low, self.high
        super()._apply(fn, recurse)
        if self.low.dtype != _at_least_float32(self.low).dtype:
            self.low = _at_least_float32(low.to(self.low.device))
            self.high = _at_least_float32(high.to(self.high.device))
        return self

    def _bounds(self, length: int | slice | None) -> tuple[Tensor, Tensor]:
        if length is None:
            return self.low, self.high
        positions = slice(0, length) if isinstance(length, int) else length
        return self.low[..., positions], self.high[..., positions]

    @torch.no_grad()
    def _observe(self, z: Tensor, length: int | slice | None) -> None:
        low, high = self._bounds(length)
        dims = tuple(range(z.dim() - low.dim()))
        if z.numel() == 0:  # an empty batch saw nothing (and still joins the exchange)
            batch_low, batch_high = torch.full_like(low, math.inf), torch.full_like(high, -math.inf)
        else:
            batch_low = z.detach().amin(dim=dims).to(low.dtype)
            batch_high = z.detach().amax(dim=dims).to(high.dtype)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # Every rank's batch is "seen in training", and replicas must stay identical.
            # One exchange, not two: min(x) = -max(-x), exactly.
            extremes = torch.stack([batch_low.neg(), batch_high])
            dist.all_reduce(extremes, op=dist.ReduceOp.MAX)
            batch_low, batch_high = extremes[0].neg(), extremes[1]
        m = self.momentum
        seen = torch.isfinite(low)
        new_low = torch.where(
            seen, torch.minimum(batch_low, low + m * (batch_low - low)), batch_low
        )
        new_high = torch.where(
            seen, torch.maximum(batch_high, high + m * (batch_high - high)), batch_high
        )
        # A ladder whose batch held a NaN or an infinity keeps its range: stored, it would
        # clip every later eval output to NaN (and the non-finite-loss guard's checkpoint).
        low.copy_(torch.where(torch.isfinite(batch_low), new_low, low))
        high.copy_(torch.where(torch.isfinite(batch_high), new_high, high))

    def forward(self, z: Tensor, length: int | slice | None = None) -> Tensor:
        if self.training:
            if self.recording:
                self._observe(z, length)
            return z
        low, high = self._bounds(length)
        return torch.clamp(z, cast(low, z.dtype), cast(high, z.dtype))

    def extra_repr(self) -> str:
        return f"shape={tuple(self.low.shape)}, momentum={self.momentum}"


@contextlib.contextmanager
def recording_paused(module: nn.Module) -> Iterator[None]:
    """Within: the ladder layers under ``module`` neither record their output ranges nor
    their health. For a forward replayed in backward (activation checkpointing): recorded
    twice, a batch would move the ranges two momentum steps (and, under data parallelism,
    add an all-reduce per layer to the backward)."""
    ranges = [m for m in module.modules() if isinstance(m, OutputRange)]
    layers = [m for m in module.modules() if isinstance(m, LadderLayer)]
    recording = [r.recording for r in ranges]
    tracking = [layer.track_health for layer in layers]
    for r in ranges:
        r.recording = False
    for layer in layers:
        layer.track_health = False
    try:
        yield
    finally:
        for r, on in zip(ranges, recording, strict=True):
            r.recording = on
        for layer, on in zip(layers, tracking, strict=True):
            layer.track_health = on


class LadderLayer(nn.Module):
    """Base class of CoFrGeNet layers: ladder bookkeeping shared by Cffn, CAttnU, CAttnM.

    Set ``track_health = True`` to record, at every forward, the
    :class:`~cofrgenet.ops.LadderStats` of its ladders (an extra no-grad pass over the partial denominators; the
    LadderHealthMonitor callback turns it on only at logging steps).
    """

    track_health: bool
    eps: float  # the clamp on |K_d|, grad mode and implementation of the layer's ladders
    grad: str
    impl: str

    def __init__(self, denominators: str, floor: float) -> None:
        super().__init__()
        check_denominators(denominators, floor)
        self.denominator_kind = denominators
        self.floor = float(floor)
        self.output_range: OutputRange | None = None  # subclasses make one if clip_outputs
        self.track_health = False
        self.health_near = NEAR_POLE  # |K_d| below which health counts a unit near a pole
        self._health: LadderStats | None = None
        self.register_load_state_dict_pre_hook(_fill_missing_ranges)

    def check_options(self, **sizes: int) -> None:
        """ValueError for a size below 1 (``dim=0`` divided by zero later) or an eps,
        grad or impl the ops refuse: said when the layer is built, not at its first
        forward. Called by subclasses once they set ``eps``, ``grad`` and ``impl``."""
        for name, size in sizes.items():
            if not (isinstance(size, int) and size >= 1):
                raise ValueError(f"{type(self).__name__} needs {name} >= 1, got {size!r}")
        check_ladder_options(self.eps, self.grad, self.impl)

    @property
    def clip_outputs(self) -> bool:
        """Whether ladder outputs are clipped in eval mode (the layer has an OutputRange)."""
        return self.output_range is not None

    @property
    def link_floor(self) -> float | None:
        """The ops' ``floor`` argument: None for the paper's denominators."""
        return self.floor if self.denominator_kind == "positive" else None

    def pvariate_ladders(self, x: Tensor, weights: LadderWeights) -> Tensor:
        """f~ of p-variate ladders on x (..., p) -> (..., L), recording health if asked.

        The CPU's implementations recompute the partial denominators in backward; triton
        (CUDA) keeps them (see :func:`cofrgenet.ops.pvariate_ladder`).
        """
        weight, bias = weights.stacked_weight(), weights.stacked_bias()  # (d, L, p), (d, L)
        if self.track_health:
            stats = pvariate_denominator_stats(
                x, weight, bias, self.eps, self.link_floor, self.health_near
            )
            self._record_health(stats)
        return pvariate_ladder(
            x, weight, bias, eps=self.eps, grad=self.grad, impl=self.impl, floor=self.link_floor
        )

    def clip(self, z: Tensor, length: int | slice | None = None) -> Tensor:
        """Ladder outputs z through the layer's OutputRange (when ``clip_outputs``)."""
        if self.output_range is None:
            return z
        return self.output_range(z, length)

    def ladder_modules(self) -> Iterator[LadderWeights]:
        return (m for m in self.modules() if isinstance(m, LadderWeights))

    def ladder_parameters(self) -> Iterator[nn.Parameter]:
        """Partial-denominator parameters (the ones the dyadic schedule freezes)."""
        for module in self.ladder_modules():
            yield from module.parameters()

    def ladder_parameters_by_depth(self) -> dict[int, list[nn.Parameter]]:
        out: dict[int, list[nn.Parameter]] = {}
        for module in self.ladder_modules():
            for k, params in module.parameters_by_depth().items():
                out.setdefault(k, []).extend(params)
        return out

    def no_weight_decay(self) -> set[str]:
        """Names (relative to this layer) of parameters weight decay must not touch.

        Ladder biases set the offset of the partial denominators: decay would pull the
        paper's denominators towards their poles. Subclasses add their own.
        """
        return {
            f"{name}.{pname}"
            for name, module in self.named_modules()
            if isinstance(module, LadderWeights)
            for pname, _ in module.named_parameters()
            if pname.startswith("bias.")
        }

    def health(self) -> LadderStats | None:
        """Statistics of the last forward run with ``track_health`` on, else None."""
        return self._health

    def _record_health(self, stats: LadderStats) -> None:
        self._health = stats

    def ladder_extra_repr(self) -> str:
        floor = f", floor={self.floor}" if self.denominator_kind == "positive" else ""
        return f"denominators={self.denominator_kind!r}{floor}, clip_outputs={self.clip_outputs}"


@contextlib.contextmanager
def ladders_running(model: nn.Module, impl: str, only: str | None = None) -> Iterator[None]:
    """Within it, the ladders of ``model`` run ``impl`` (those that run ``only``, where
    given); their own again after. The export's check runs the eager continuant, as a
    CPU model does; ``cofr generate`` runs ``auto``'s eagerly on CPU (torch.compile's
    warm-up, seconds at the first long window, does not pay in one generation)."""
    chosen = [m for m in model.modules() if isinstance(m, LadderLayer) and only in (None, m.impl)]
    own = [m.impl for m in chosen]
    try:
        for module in chosen:
            module.impl = impl
        yield
    finally:
        for module, impl_of in zip(chosen, own, strict=True):
            module.impl = impl_of


def _fill_missing_ranges(
    module: nn.Module, state_dict: dict[str, Tensor], prefix: str, *args
) -> None:
    """Checkpoints from before output clipping load with empty ranges (no clipping)."""
    output_range = getattr(module, "output_range", None)
    if output_range is None:
        return
    for name, buffer in output_range.named_buffers():
        key = f"{prefix}output_range.{name}"
        if key not in state_dict:
            state_dict[key] = buffer.detach().clone()


def resolve_ladder_bias(bias: bool, ladder_bias: bool | None) -> bool:
    """``ladder_bias=None`` follows ``bias``."""
    return bias if ladder_bias is None else ladder_bias


def denominator_init(has_bias: bool, fan_in_std: float) -> tuple[float, float]:
    """(weight std, bias offset) giving w . x + b ~ N(offset, std^2) for inputs of spread
    fan_in_std (sqrt(fan_in) times the input's std)."""
    std = DENOMINATOR_STD if has_bias else DENOMINATOR_STD_NO_BIAS
    return std / fan_in_std, DENOMINATOR_OFFSET


def fan_in_spread(fan_in: int, input_std: float = 1.0) -> float:
    return math.sqrt(fan_in) * input_std
