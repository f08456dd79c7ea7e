"""Training and generation speed of each model variant: ``cofr bench train``.

Every variant is built at one width and depth (``--n-layer``, ``--n-embd``, ...), eager
and ``torch.compile``d, and trained on random tokens with the trainer's AdamW
(:func:`cofrgenet.training.optim.build_adamw`, default settings) in a plain loop (the
model's cost, without Lightning's per-step overhead, which is the same for all). In one
run, with interleaved rounds so that a drifting machine hits all of them alike (see
:func:`run_benchmark` for the order of the run):

* tokens/s: the median of the timed steps (warm-up steps, where compilation happens,
  left out), and each variant's ratio to gpt2 in the same mode;
* achieved FLOP/s from the analytic training FLOPs per token
  (:func:`cofrgenet.models.estimate_flops_per_token`), and MFU against a peak measured in
  the same run (the best of a few large matmuls in the training dtype; none where a step
  beat that peak, as bf16 steps do on a CPU without bf16 matmuls);
* graph breaks of the whole-model compile (``torch._dynamo.explain``);
* other load: the CPU share other processes used while the rounds ran
  (:class:`~cofrgenet.bench.timing.BackgroundLoad`, flagged above ``BUSY_THRESHOLD``, as
  ``cofr bench ops`` does);
* memory: activation bytes per token kept for backward (every tensor autograd saves,
  parameters excluded), by the whole model and by each FFN / attention replacement
  beside the layer it replaces, and the peak memory of training above the built model
  (gradients, optimizer state, activations; CUDA: the allocator's peak over three steps;
  CPU: the growth of a fresh process's peak RSS over three steps);
* generation: tokens/s with the mixers' caches against recomputing the context for every
  token, and the latency of one token at a full context both ways;
* mode ``recompute``: eager with activation checkpointing (``GPT.recompute_blocks``, as
  ``model.activation_checkpointing``), timed in the same rounds as eager, with its
  activations and peak memory: what the recomputation costs and saves.

Writes ``train-<device>-<date>.{md,json}`` under ``--out-dir`` with the command, and
rewrites them, marked partial, after each stage of the run: a run cut short (a
wall-clock limit) keeps what it measured; one stopped by Ctrl-C, SIGTERM or an error
marks that report stopped, names what it did not measure, and says where it is. A
report already there is never replaced: a
second run of the day writes ``train-<device>-<date>-2.{md,json}`` (then ``-3``, ...).
Settings are checked before any work (sizes >= 1, a block of 3 tokens or more for
generation, a warm-up step for the compiled modes to compile in, the dtype, the device,
every variant's model, the output folder): a wrong one is a one-line error.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from cofrgenet.atomic import write_text_atomic
from cofrgenet.bench import variants
from cofrgenet.bench.files import (
    check_file_name_part,
    free_stem,
    make_out_dir,
    measure_keeping_partial,
    stem_once,
    with_suffix,
)
from cofrgenet.bench.machine import machine_summary, name_slug
from cofrgenet.dataclass_options import (
    DEVICE_HELP,
    add_dataclass_arguments,
    dataclass_from_args,
    resolved_device,
)
from cofrgenet.errors import SEED_LIMIT

#: Variant name -> (preset, overrides): every variant of ``bench.variants``, rebuilt at the
#: bench's shape.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    name: variants.model(name) for name in variants.MODELS
}
#: The variants timed unless ``--variants`` is given.
DEFAULT_VARIANTS = (
    "gpt2",
    "cofrgenet-f",
    "cofrgenet-f-elementwise",
    "cofrgenet-a",
    "cofrgenet-a-u",
    "cofrgenet",
    "llama3",
    "lstm",
)
BASELINE = "gpt2"
#: The modes, and the torch.compile mode of the compiled ones. cudagraphs records the
#: model's forward and backward kernels once as CUDA graphs and replays them, without a
#: launch per kernel on the host (the loss and the optimizer still launch theirs; CUDA
#: only: on a CPU inductor skips the graphs silently, so it is refused there). recompute
#: is eager with activation checkpointing (transformers only: a recurrent model has no
#: blocks to recompute).
MODES = ("eager", "compiled", "cudagraphs", "recompute")
COMPILE_MODES = {"compiled": None, "cudagraphs": "reduce-overhead"}
#: The modes run uncompiled: timed together, in the first stage.
UNCOMPILED_MODES = ("eager", "recompute")
#: The training dtypes: float32, or autocast to one of the others.
DTYPES = ("float32", "bfloat16", "float16")
#: Settings that must be >= 1.
POSITIVE_FIELDS = (
    "n_layer",
    "n_embd",
    "n_head",
    "block_size",
    "vocab_size",
    "batch_size",
    "steps",
    "rounds",
    "gen_tokens",
)
#: Settings that may be 0.
NON_NEGATIVE_FIELDS = ("warmup", "profile_steps")
SHAPE_FIELDS = ("n_layer", "n_embd", "n_head", "block_size", "vocab_size")
#: Tokens of the generation prompt (the block's, where it is shorter).
PROMPT_TOKENS = 8
#: The shortest block generation can time: a one-token step needs a prefill of at least
#: one token before it, inside a context of ``block_size - 1`` (the whole-context forward
#: it is compared with).
MIN_GENERATION_BLOCK = 3
#: (variant, mode): one trainer of the run.
Key = tuple[str, str]


@dataclass
class TrainBenchConfig:
    variants: tuple[str, ...] = field(
        default=DEFAULT_VARIANTS,
        metadata={
            "help": f"variants ({', '.join(VARIANTS)}) or any preset name: its architecture "
            "(attention, FFN, ladders), built at this bench's shape (--n-layer, --n-embd, "
            "...), not the preset's size"
        },
    )
    modes: tuple[str, ...] = field(
        default=("eager", "compiled"),
        metadata={
            "help": "eager, compiled (torch.compile), cudagraphs (torch.compile with "
            "mode='reduce-overhead': the model's kernels replayed as CUDA graphs; --device "
            "cuda only) and/or recompute (eager with activation checkpointing)"
        },
    )
    n_layer: int = field(default=4, metadata={"help": "layers of every variant"})
    n_embd: int = field(default=256, metadata={"help": "width of every variant"})
    n_head: int = field(
        default=4,
        metadata={
            "help": "attention heads (llama3 keeps grouped key/value heads: the most that "
            "divide them, up to its preset's)"
        },
    )
    block_size: int = field(default=256, metadata={"help": "sequence length"})
    vocab_size: int = field(default=512, metadata={"help": "vocabulary"})
    batch_size: int = field(default=8, metadata={"help": "sequences per step"})
    steps: int = field(default=4, metadata={"help": "timed steps per variant and round"})
    warmup: int = field(
        default=2,
        metadata={
            "help": "untimed steps before the first round, where the compiled modes compile "
            "(at least 1 with compiled, 2 with cudagraphs)"
        },
    )
    rounds: int = field(default=5, metadata={"help": "interleaved rounds"})
    dtype: str = field(
        default="float32",
        metadata={"help": "float32, or bfloat16 / float16 (autocast)", "choices": DTYPES},
    )
    device: str = field(default="auto", metadata={"help": DEVICE_HELP})
    memory: bool = field(
        default=True, metadata={"help": "measure activation and peak memory (eager mode)"}
    )
    generation: bool = field(
        default=True, metadata={"help": "measure generation speed (eager mode)"}
    )
    gen_tokens: int = field(default=32, metadata={"help": "tokens generated per variant"})
    profile_steps: int = field(
        default=2,
        metadata={
            "help": "steps of each variant and mode run under torch.profiler after the timed "
            "ones: host dispatches, device kernels and their time per step, the costliest "
            "operators (0: none)"
        },
    )
    seed: int = field(
        default=0, metadata={"help": f"random seed of weights and tokens, 0 to {SEED_LIMIT - 1}"}
    )
    out_dir: str = field(default="runs/bench", metadata={"help": "folder of the report"})
    tag: str | None = field(default=None, metadata={"help": "appended to the report's file name"})

    def __post_init__(self) -> None:
        from cofrgenet.errors import UserError, check_seed

        check_seed(self.seed, "--seed")  # as bench quality's --seeds: -1 was taken
        self.device = resolved_device(self.device)  # what runs it and what the report names
        bounds = [(name, 1) for name in POSITIVE_FIELDS]
        for name, least in bounds + [(name, 0) for name in NON_NEGATIVE_FIELDS]:
            if getattr(self, name) < least:
                flag = f"--{name.replace('_', '-')}"
                raise UserError(f"{flag} must be >= {least}, got {getattr(self, name)}")
        if self.dtype not in DTYPES:
            raise UserError(f"--dtype {self.dtype!r}: use one of {', '.join(DTYPES)}")
        if self.n_embd % self.n_head:
            raise UserError(
                f"--n-head {self.n_head} does not divide --n-embd {self.n_embd}: attention "
                "splits the width into heads; pick a divisor"
            )


@dataclass
class VariantResult:
    variant: str
    mode: str
    params: int
    flops_per_token: int
    step_ms: list[float] = field(default_factory=list)
    #: The run's numbers of the rounds this variant was timed in, one per ``steps``
    #: entries of ``step_ms``: ratios per round pair the rounds two variants shared.
    round_ids: list[int] = field(default_factory=list)
    tokens_per_s: float = 0.0
    #: The largest share of the CPU other processes used during a stage of rounds it was
    #: timed in (:class:`~cofrgenet.bench.timing.BackgroundLoad`; None: not measurable).
    background_load: float | None = None
    graph_breaks: int | None = None
    activation_bytes_per_token: int | None = None
    peak_memory_bytes: int | None = None
    gen_cached_tokens_per_s: float | None = None
    gen_recompute_tokens_per_s: float | None = None
    latency_cached_ms: float | None = None
    latency_recompute_ms: float | None = None
    #: The share of the CPU other processes used while generation was timed.
    gen_background_load: float | None = None
    #: Where a step goes (:class:`~cofrgenet.bench.step_profile.StepProfile`, as a dict).
    profile: dict[str, Any] | None = None


def model_config(cfg: TrainBenchConfig, variant: str) -> Any:
    from cofrgenet.models import ModelConfig

    preset, overrides = VARIANTS.get(variant, (variant, {}))
    shape = {name: getattr(cfg, name) for name in SHAPE_FIELDS}
    kv_heads = ModelConfig.from_preset(preset).n_kv_head
    if kv_heads is not None and cfg.n_head % kv_heads:
        # The preset's groups do not fit --n-head: the most key/value heads that do,
        # never more than the preset's (grouped-query attention stays grouped). The
        # report lists every variant's key/value heads.
        fitting = max(k for k in range(1, kv_heads + 1) if cfg.n_head % k == 0)
        overrides = {**overrides, "n_kv_head": fitting}
    return ModelConfig.from_preset(preset, **shape, **overrides)


def recomputes(cfg: TrainBenchConfig, variant: str) -> bool:
    """Whether ``variant`` has blocks to recompute (mode recompute): transformers do."""
    from cofrgenet.models.build import build_shapes

    return hasattr(build_shapes(model_config(cfg, variant)), "recompute_blocks")


def timed_keys(cfg: TrainBenchConfig) -> list[Key]:
    """Every (variant, mode) the run times, each variant's modes together, as given
    (recompute for the variants that have blocks to recompute)."""
    return [
        (v, m) for v in cfg.variants for m in cfg.modes if m != "recompute" or recomputes(cfg, v)
    ]


def grouped_kv_heads(cfg: TrainBenchConfig) -> dict[str, int]:
    """The key/value heads of the variants with grouped-query attention (llama3's)."""
    configs = {variant: model_config(cfg, variant) for variant in cfg.variants}
    return {v: c.n_kv_head for v, c in configs.items() if c.n_kv_head not in (None, cfg.n_head)}


def check_settings(cfg: TrainBenchConfig) -> None:
    """What ``__post_init__`` cannot see, checked before any work: the variants and modes
    (cudagraphs on a GPU only, a warm-up for the compiled ones), each variant's model at
    the bench's shape, the device, the output folder."""
    from cofrgenet.dataclass_options import device_problem
    from cofrgenet.errors import UserError, did_you_mean

    unknown = [v for v in cfg.variants if v not in VARIANTS and "-" not in v]
    if unknown:
        hint = did_you_mean(unknown[0], list(VARIANTS))
        raise UserError(
            f"--variants: unknown variant {unknown[0]!r}{hint}; known: {', '.join(VARIANTS)}, "
            "or a preset name"
        )
    bad_modes = [m for m in cfg.modes if m not in MODES]
    if bad_modes:
        raise UserError(
            f"--modes: unknown mode {bad_modes[0]!r}{did_you_mean(bad_modes[0], list(MODES))}; "
            f"known: {', '.join(MODES)}"
        )
    if not cfg.variants or not cfg.modes:
        raise UserError("nothing to time: give --variants and --modes")
    if cfg.generation and "eager" in cfg.modes and cfg.block_size < MIN_GENERATION_BLOCK:
        raise UserError(
            f"--block-size {cfg.block_size}: generation times a one-token step after a "
            f"prefill, within a context of the block less one token; give --block-size "
            f"{MIN_GENERATION_BLOCK} or more, or --no-generation"
        )
    if "cudagraphs" in cfg.modes and not cfg.device.startswith("cuda"):
        # Inductor skips CUDA graphs off a GPU without a word: compiled, named cudagraphs.
        raise UserError(
            f"--modes cudagraphs needs --device cuda (on {cfg.device} inductor runs no CUDA "
            "graphs); give --device cuda, or time --modes compiled here"
        )
    compiling = [m for m in cfg.modes if m in COMPILE_MODES]
    if compiling and cfg.warmup < 1:
        # torch.compile compiles in the first call: timed, seconds of compiling would be
        # read as one step (a 17 s step, 7 tokens/s).
        raise UserError(
            f"--warmup 0: {compiling[0]} compiles the model in its first step, which would be "
            "timed; give --warmup 1 or more"
        )
    if "cudagraphs" in cfg.modes and cfg.warmup < 2:
        # CUDA graph trees run a step eagerly, then record: the third step is a replay.
        raise UserError(
            f"--warmup {cfg.warmup}: cudagraphs records its graphs in the second step, which "
            "would be timed; give --warmup 2 or more"
        )
    for option, given in (("--variants", cfg.variants), ("--modes", cfg.modes)):
        twice = next((name for name in given if given.count(name) > 1), None)
        if twice is not None:  # one trainer per (variant, mode): a repeat would be a new row
            raise UserError(f"{option}: {twice!r} is given twice; name each once")
    for variant in cfg.variants:
        try:
            model_config(cfg, variant)
        except UserError as error:
            raise UserError(f"variant {variant}: {error}") from None
    if not timed_keys(cfg):  # recompute alone, of models without blocks: an empty report
        raise UserError(
            f"--modes recompute: none of --variants {','.join(cfg.variants)} has transformer "
            "blocks to recompute, so nothing would be timed; add eager or compiled to --modes, "
            "or a transformer to --variants"
        )
    problem = device_problem(cfg.device)
    if problem is not None:
        raise UserError(f"--device: {problem}")
    check_file_name_part("--tag", cfg.tag)


def _autocast(cfg: TrainBenchConfig) -> Any:
    import torch

    if cfg.dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(cfg.device).type, dtype=getattr(torch, cfg.dtype))


class Trainer:
    """One variant in one mode: a model, AdamW and a step on fixed random tokens."""

    def __init__(self, cfg: TrainBenchConfig, variant: str, mode: str) -> None:
        import torch

        from cofrgenet.models import build_model, count_parameters, estimate_flops_per_token
        from cofrgenet.training.optim import OptimizerConfig, build_adamw

        torch.manual_seed(cfg.seed)
        self.cfg, self.device = cfg, torch.device(cfg.device)
        self.config = model_config(cfg, variant)
        self.model = build_model(self.config).to(self.device).train()
        self.forward: Callable[..., Any] = self.model
        self.cudagraphs = mode == "cudagraphs"
        if mode == "recompute":
            self.model.recompute_blocks()
        if mode in COMPILE_MODES:
            self.forward = torch.compile(self.model, mode=COMPILE_MODES[mode])
        # The trainer's AdamW (groups by role, fused where torch has it), as users run it.
        self.optimizer = build_adamw(self.model, OptimizerConfig())
        generator = torch.Generator().manual_seed(cfg.seed)
        self.batch = torch.randint(
            0, cfg.vocab_size, (cfg.batch_size, cfg.block_size + 1), generator=generator
        ).to(self.device)
        self.result = VariantResult(
            variant=variant,
            mode=mode,
            params=count_parameters(self.config).total,
            flops_per_token=estimate_flops_per_token(self.config).training,
        )

    def loss(self) -> Any:
        import torch.nn.functional as F

        inputs, targets = self.batch[:, :-1], self.batch[:, 1:]
        with _autocast(self.cfg):
            logits = self.forward(inputs)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    def step(self) -> None:
        if self.cudagraphs:  # a new step: the graphs may reuse the last one's outputs
            import torch

            torch.compiler.cudagraph_mark_step_begin()
        self.loss().backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def timed_steps(self, count: int) -> list[float]:
        """Milliseconds of each of ``count`` training steps."""
        from cofrgenet.bench.timing import time_once

        return [time_once(self.step, self.device) for _ in range(count)]


# ------------------------------------------------------------------ measurements


def peak_matmul_flops(cfg: TrainBenchConfig) -> float:
    """Best FLOP/s of a square matmul in the training dtype (the run's own peak; the one
    measurement of ``cofr fit``'s CPU MFU, :func:`~cofrgenet.training.perf.matmul_peak_flops`)."""
    import torch

    from cofrgenet.training.perf import matmul_peak_flops

    dtype = getattr(torch, cfg.dtype)
    return matmul_peak_flops(dtype, torch.device(cfg.device), repeats=6)


def datasheet_peak_flops(device: Any, dtype: str) -> float | None:
    """The data sheet's dense peak of a known GPU for ``dtype`` (None elsewhere: on a CPU
    ``device_peak_flops`` measures one): the usual MFU's denominator, beside the run's own
    measured matmul peak."""
    from cofrgenet.training.perf import device_peak_flops

    return device_peak_flops(device, dtype) if device.type == "cuda" else None


def graph_breaks(trainer: Trainer) -> int:
    import torch

    # explain has no public counterpart; it compiles, so reset Dynamo after it.
    explained = torch._dynamo.explain(trainer.model)(trainer.batch[:, :-1])
    torch.compiler.reset()
    return int(explained.graph_break_count)


#: Autograd nodes of a cast or a view: what lies between a parameter and the copy of it
#: that autocast makes for a matmul (``ToCopyBackward0``, then ``TBackward0``).
CAST_OR_VIEW = frozenset({
    "ToCopyBackward0", "TBackward0", "TransposeBackward0", "PermuteBackward0",
    "ViewBackward0", "UnsafeViewBackward0", "ExpandBackward0", "UnsqueezeBackward0",
    "SqueezeBackward0", "SqueezeBackward1", "AliasBackward0", "CloneBackward0",
})  # fmt: skip


def is_parameter_copy(tensor: Any, params: set[int]) -> bool:
    """Whether ``tensor`` is a parameter's cast or view (autocast's bf16 weight copy): its
    autograd history leads to one of ``params`` (ids) through casts and views only."""
    node = tensor.grad_fn
    while node is not None and node.name() in CAST_OR_VIEW:
        inputs = [n for n, _ in node.next_functions if n is not None]
        if len(inputs) != 1:
            return False
        node = inputs[0]
    return node is not None and id(getattr(node, "variable", None)) in params


def saved_bytes(module: Any, run: Callable[[], Any]) -> int:
    """Bytes of the tensors autograd keeps for backward while ``run()`` runs (each storage
    once; ``module``'s parameters excluded, and their casts under autocast: weights, not
    activations)."""
    import torch

    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    param_ids = {id(p) for p in module.parameters()}
    storages: dict[int, int] = {}

    def pack(tensor: Any) -> Any:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params and not is_parameter_copy(tensor, param_ids):
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = run()
    del out
    return sum(storages.values())


def activation_bytes(trainer: Trainer) -> int:
    """Bytes kept for backward by one training forward of the whole model."""
    return saved_bytes(trainer.model, trainer.loss)


#: (slot, mixer, config overrides): each replacement beside the layer it replaces.
LAYERS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("ffn", "mlp", {}),
    ("ffn", "cffn", {}),
    ("ffn", "cffn", {"cffn_ladder": "elementwise"}),
    ("attention", "softmax", {}),
    ("attention", "cattn_m", {}),
    ("attention", "cattn_u", {}),
)


def layer_activation_bytes(cfg: TrainBenchConfig) -> dict[str, int]:
    """Bytes per token each FFN / attention layer keeps for backward (its input included),
    at the bench's width, block and batch, in training mode."""
    import torch

    from cofrgenet.models.registry import ATTENTION, FFN

    out: dict[str, int] = {}
    for slot, mixer, overrides in LAYERS:
        config = model_config(cfg, "gpt2")
        config = type(config).from_dict({**config.to_dict(), **overrides})
        registry = FFN if slot == "ffn" else ATTENTION
        layer = registry.build(mixer, config, 0).to(cfg.device).train()
        x = torch.randn(
            cfg.batch_size, cfg.block_size, cfg.n_embd, device=cfg.device, requires_grad=True
        )
        with _autocast(cfg):
            nbytes = saved_bytes(layer, lambda layer=layer, x=x: layer(x))
        label = mixer + "".join(f" {v}" for v in overrides.values())
        out[label] = nbytes // (cfg.batch_size * cfg.block_size)
    return out


def peak_rss_bytes() -> int:
    """This process's peak resident set size (VmHWM of /proc/self/status), bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status: peak RSS needs Linux")


def peak_step_memory(cfg: TrainBenchConfig, variant: str, mode: str = "eager") -> int:
    """Peak memory of training above the built model (bytes): gradients, optimizer state
    and the activations of a step, over the first three steps (``mode``: an uncompiled
    one)."""
    import torch

    if cfg.device.startswith("cuda"):
        from cofrgenet.bench.timing import synchronize

        trainer = Trainer(cfg, variant, mode)
        synchronize(trainer.device)
        torch.cuda.reset_peak_memory_stats(trainer.device)
        base = torch.cuda.memory_allocated(trainer.device)
        for _ in range(3):
            trainer.step()
        synchronize(trainer.device)
        return torch.cuda.max_memory_allocated(trainer.device) - base
    # CPU: a fresh process, so the high-water mark of the RSS is this variant's alone.
    # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss over from the parent
    # through fork and exec, so a child of a big process would see no growth.
    probe = (
        "import json, sys\n"
        "from cofrgenet.bench.train import Trainer, TrainBenchConfig, peak_rss_bytes\n"
        "cfg = TrainBenchConfig(**json.loads(sys.argv[1]))\n"
        "t = Trainer(cfg, sys.argv[2], sys.argv[3])\n"
        "before = peak_rss_bytes()\n"
        "t.step(); t.step(); t.step()\n"
        "print(peak_rss_bytes() - before)\n"
    )
    settings = {k: v for k, v in asdict(cfg).items() if k != "variants"}
    out = subprocess.run(
        [sys.executable, "-c", probe, json.dumps(settings), variant, mode],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip().splitlines()[-1])


def _one_token_steps(model: Any, prefix: Any) -> Callable[[Any], Any]:
    """After reading ``prefix`` (B, T), a function taking the next tokens (B, 1) to their
    logits, carrying the model's cache (transformers) or state (recurrent models)."""
    if hasattr(model, "new_cache"):
        cache = model.new_cache()
        model(prefix, cache)
        return lambda tokens: model(tokens, cache)
    _, state = model.step(prefix)
    held = [state]

    def step(tokens: Any) -> Any:
        logits, held[0] = model.step(tokens, held[0])
        return logits

    return step


#: Timed forwards per latency figure (one-token steps, and whole-context forwards).
LATENCY_STEPS = 16
#: Timed generations per tokens/s figure, cached and recomputed interleaved (median).
GENERATION_REPEATS = 3


def prompt_tokens(block_size: int) -> int:
    """The generation prompt's length: :data:`PROMPT_TOKENS`, or the block where shorter
    (a longer prompt would not fit the model's context)."""
    return min(PROMPT_TOKENS, block_size)


def generation_speed(cfg: TrainBenchConfig, trainer: Trainer) -> dict[str, float | None]:
    """Tokens/s generating ``gen_tokens`` after a prompt of :func:`prompt_tokens`, cached
    and recomputed (medians of :data:`GENERATION_REPEATS` interleaved calls), the
    latency of one token near a full context both ways (ms, medians), and the other
    processes' share of the CPU meanwhile."""
    from cofrgenet.bench.timing import BackgroundLoad

    with BackgroundLoad() as background:
        speeds: dict[str, float | None] = {**_generation_speed(cfg, trainer)}
    return speeds | {"gen_background_load": background.fraction}


def _generation_speed(cfg: TrainBenchConfig, trainer: Trainer) -> dict[str, float]:
    import torch

    from cofrgenet.bench.timing import time_interleaved, time_once
    from cofrgenet.nn import reusing_stacked_weights
    from cofrgenet.nn.decoding import sample_next

    model, block, device = trainer.model.eval(), cfg.block_size, trainer.device
    prompt = trainer.batch[:1, : prompt_tokens(block)]

    def recompute(idx: Any, new: int) -> Any:
        for _ in range(new):
            logits = model(idx[:, -block:])[:, -1, :]
            idx = torch.cat([idx, sample_next(logits, 0.0)], dim=1)
        return idx

    def rate(ms: list[float]) -> float:
        return cfg.gen_tokens / (statistics.median(ms) / 1e3)

    context = trainer.batch[:1, : block - 1]
    # Both ways in inference mode, as model.generate runs: the ratio is the cache's alone.
    with torch.inference_mode(), reusing_stacked_weights():
        # First calls at new shapes pay for kernel selection and compilation: untimed.
        model.generate(prompt, 4, temperature=0.0)
        recompute(prompt, 4)
        ways = {
            "cached": lambda: model.generate(prompt, cfg.gen_tokens, temperature=0.0),
            "recomputed": lambda: recompute(prompt, cfg.gen_tokens),
        }
        ms = time_interleaved(ways, GENERATION_REPEATS, device)  # medians, side by side
        cached, recomputed = rate(ms["cached"]), rate(ms["recomputed"])
        # Latency of one token near a full context: the median of LATENCY_STEPS forwards
        # of the whole context, against LATENCY_STEPS consecutive one-token steps at
        # positions block - LATENCY_STEPS - 1 .. block - 2 after a prefill (twice).
        latency_recompute = statistics.median(
            time_once(lambda: model(context), device) for _ in range(LATENCY_STEPS)
        )
        prefill = max(1, block - 1 - LATENCY_STEPS)
        latencies: list[float] = []
        for _ in range(2 if hasattr(model, "new_cache") or hasattr(model, "step") else 0):
            step = _one_token_steps(model, context[:, :prefill])
            for i in range(prefill, block - 1):
                tokens = context[:, i : i + 1]
                latencies.append(time_once(lambda s=step, t=tokens: s(t), device))
        latency_cached = statistics.median(latencies) if latencies else latency_recompute
    model.train()
    return {
        "gen_cached_tokens_per_s": cached,
        "gen_recompute_tokens_per_s": recomputed,
        "latency_cached_ms": latency_cached,
        "latency_recompute_ms": latency_recompute,
    }


# ------------------------------------------------------------------ the run


def compiled_stages(cfg: TrainBenchConfig) -> list[tuple[Key, tuple[Key, ...]]]:
    """Each variant to compile (in each compiled mode), with the warm trainers timed
    beside it.

    Beside its eager self (compiled vs eager per round) and gpt2 in the same mode (vs gpt2
    per round), so that every ratio the report gives per round comes from steps taken side
    by side. gpt2 goes first in each mode: the others need it warm.
    """
    stages = []
    for mode in (m for m in cfg.modes if m in COMPILE_MODES):
        for variant in sorted(cfg.variants, key=lambda v: v != BASELINE):
            partners = [(variant, "eager")] if "eager" in cfg.modes else []
            if variant != BASELINE and BASELINE in cfg.variants:
                partners.append((BASELINE, mode))
            stages.append(((variant, mode), tuple(partners)))
    return stages


class _Run:
    """The trainers of one run, what they measured so far, and its report at any time."""

    def __init__(self, cfg: TrainBenchConfig, command: str) -> None:
        self.cfg, self.command = cfg, command
        self.started = dt.datetime.now(dt.timezone.utc)
        #: Report order: each variant's modes together, as given.
        self.keys: list[Key] = timed_keys(cfg)
        self.trainers: dict[Key, Trainer] = {}
        #: "variant mode" -> the error that stopped it (a compile failing on a new machine).
        self.failed: dict[str, str] = {}
        self.rounds_done = 0
        self.layers: dict[str, int] = {}
        # Measured first, for the partial reports' MFU; again at the end (the best counts).
        self.peak = peak_matmul_flops(cfg)

    def warm_up(self, keys: Sequence[Key]) -> None:
        """Build the trainers of ``keys`` and take their untimed steps (compilation)."""
        for key in keys:
            self.trainers[key] = Trainer(self.cfg, *key)
            self.trainers[key].timed_steps(self.cfg.warmup)

    def time_rounds(self, keys: Sequence[Key]) -> None:
        """``cfg.rounds`` interleaved rounds of ``keys`` (all warm), in ``round_order``.

        A round is recorded once all its keys are timed: one that raises leaves no
        half-round behind (round ids keep pairing the steps taken side by side).
        """
        from cofrgenet.bench.timing import BackgroundLoad, round_order

        # Other processes on the cores skew the steps (as in `cofr bench ops`): measured.
        with BackgroundLoad() as background:
            for index in range(self.cfg.rounds):
                steps = {key: self.trainers[key].timed_steps(self.cfg.steps)
                         for key in round_order(keys, index)}  # fmt: skip
                for key, ms in steps.items():
                    result = self.trainers[key].result
                    result.step_ms += ms
                    result.round_ids.append(self.rounds_done)
                self.rounds_done += 1
        if background.fraction is not None:
            for key in keys:
                result = self.trainers[key].result
                result.background_load = max(result.background_load or 0.0, background.fraction)

    def profile(self, keys: Sequence[Key]) -> None:
        """``cfg.profile_steps`` steps of each of ``keys`` under torch.profiler (after the
        timed ones: the profiler's overhead stays out of tokens/s). A profile that fails
        leaves the key's timings as they are."""
        from cofrgenet.bench.step_profile import profile_steps

        if not self.cfg.profile_steps:
            return
        for key in keys:
            trainer = self.trainers[key]
            try:
                found = profile_steps(trainer.step, self.cfg.profile_steps, trainer.device)
            except Exception as error:  # noted; the run goes on
                print(f"{' '.join(key)} not profiled: {error}", file=sys.stderr)
            else:
                trainer.result.profile = asdict(found)

    def timed_keys(self) -> list[Key]:
        """The keys with timed steps, in report order."""
        return [k for k in self.keys if k in self.trainers and self.trainers[k].result.step_ms]

    def report(self, partial: bool) -> dict[str, Any]:
        """The report of what is timed so far; ``partial`` marks one of an unfinished run."""
        import torch

        device = torch.device(self.cfg.device)
        device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        tokens_per_step = self.cfg.batch_size * self.cfg.block_size
        results = [self.trainers[k].result for k in self.timed_keys()]
        for result in results:  # from every step timed so far
            result.tokens_per_s = tokens_per_step / (statistics.median(result.step_ms) / 1e3)
        report = {
            "command": self.command,
            "date": self.started.date().isoformat(),
            "started": self.started.isoformat(timespec="seconds"),
            "minutes": (dt.datetime.now(dt.timezone.utc) - self.started).total_seconds() / 60,
            "device": device_name,
            "machine": machine_summary(device),
            "config": asdict(self.cfg),
            "peak_flops": self.peak,
            "datasheet_peak_flops": datasheet_peak_flops(device, self.cfg.dtype),
            "kv_heads": grouped_kv_heads(self.cfg),
            "layer_activation_bytes_per_token": dict(self.layers),
            "results": [asdict(result) for result in results],
            "pairs": len(self.keys),  # to time: recompute is for transformers only
        }
        if self.failed:
            report["failed"] = dict(self.failed)
        if partial:
            report["partial"] = True
        return report

    def warm_up_each(self, keys: Sequence[Key]) -> list[Key]:
        """Warm up each of ``keys``; those that fail (a dtype a layer does not support on
        this device, say) are recorded, and the others returned."""
        warm = []
        for key in keys:
            try:
                self.warm_up([key])
            except Exception as error:  # reported; the other variants still run
                self._record_failure(key, error)
            else:
                warm.append(key)
        return warm

    def compile_stage(self, key: Key, partners: Sequence[Key]) -> None:
        """Compile ``key`` and time it beside ``partners``; a failure (a cold compile on a
        machine this code never ran on, say) is recorded and the run goes on."""
        partners = [p for p in partners if p in self.trainers]  # not those that failed
        try:
            self.warm_up([key])
            self.time_rounds([key, *partners])
            self.profile([key])
        except Exception as error:  # reported; the other variants still run
            self._record_failure(key, error)

    def _record_failure(self, key: Key, error: Exception) -> None:
        message = f"{type(error).__name__}: {(str(error).strip() or '?').splitlines()[0][:300]}"
        self.failed[" ".join(key)] = message
        self.trainers.pop(key, None)  # frees its model and compiled graphs
        print(f"{' '.join(key)} failed, the run goes on: {message}", file=sys.stderr)


def run_benchmark(
    cfg: TrainBenchConfig,
    command: str,
    on_update: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Time every variant and mode of ``cfg``; the report (see :func:`to_markdown`).

    In stages, cheapest first, so that a run cut short has measured the most it could:
    every variant eager, in ``rounds`` interleaved rounds, then its memory and generation;
    the layers' activations; then each variant compiled (the costly part: a cold
    whole-model compile each), in ``rounds`` rounds beside the warm trainers it is
    compared with (:func:`compiled_stages`); graph breaks last (``torch._dynamo.explain``
    drops every compiled graph). ``on_update`` gets the partial report after each stage.
    """
    check_settings(cfg)
    compiled_modes = sum(mode in COMPILE_MODES for mode in cfg.modes)
    with _compile_limits(len(cfg.variants) * max(1, compiled_modes)):
        return _run_benchmark(cfg, command, on_update)


@contextlib.contextmanager
def _compile_limits(models: int) -> Iterator[None]:
    """Room for a compiled graph per model (variant and compiled mode): they share
    ``forward``'s code object, whose cache holds 8 by default; past it, torch runs a model
    eager with a warning, and the bench would time that as compiled. Hitting the limit
    anyway is an error (recorded)."""
    import torch._inductor.config

    config = torch.compiler.config
    limits = {
        "recompile_limit": max(config.recompile_limit, 4 * models),
        "fail_on_recompile_limit_hit": True,
    }
    # A cudagraphs model whose graphs inductor would run without CUDA graphs (a mutated
    # input, a CPU op in the graph) fails, recorded with inductor's reason, instead of
    # being timed as cudagraphs. (On a CPU inductor skips them silently: check_settings
    # refuses cudagraphs there.)
    inductor = torch._inductor.config
    graphs = (
        {"triton.cudagraph_or_error": True}
        if hasattr(inductor.triton, "cudagraph_or_error")
        else {}
    )
    with config.patch(**limits), inductor.patch(graphs):
        yield


def _run_benchmark(
    cfg: TrainBenchConfig,
    command: str,
    on_update: Callable[[dict[str, Any]], None] | None,
) -> dict[str, Any]:
    run = _Run(cfg, command)

    def update() -> None:
        if on_update is not None:
            on_update(run.report(partial=True))

    tokens_per_step = cfg.batch_size * cfg.block_size
    eager = run.warm_up_each([key for key in run.keys if key[1] in UNCOMPILED_MODES])
    if eager:
        run.time_rounds(eager)
        run.profile(eager)
        update()
    for key in eager:
        trainer, result = run.trainers[key], run.trainers[key].result
        if cfg.memory:
            result.activation_bytes_per_token = activation_bytes(trainer) // tokens_per_step
            result.peak_memory_bytes = peak_step_memory(cfg, *key)
        if cfg.generation and key[1] == "eager":  # the same model as recompute's
            for name, value in generation_speed(cfg, trainer).items():
                setattr(result, name, value)
        if cfg.memory or cfg.generation:
            update()
    if cfg.memory:
        run.layers = layer_activation_bytes(cfg)
        update()
    for key, partners in compiled_stages(cfg):
        run.compile_stage(key, partners)
        update()
    run.peak = max(run.peak, peak_matmul_flops(cfg))
    compiled = any(key[1] in COMPILE_MODES for key in run.timed_keys())
    # Whole but for the graph breaks (counting re-traces each model); without a compiled
    # mode there are none to count and the final report follows at once.
    if on_update is not None and compiled:
        on_update({**run.report(partial=True), "graph_breaks_pending": True})
    counted: dict[str, int] = {}  # variant -> breaks: the count traces the model, not a mode
    for key in run.timed_keys():
        if key[1] in COMPILE_MODES:
            try:
                if key[0] not in counted:
                    counted[key[0]] = graph_breaks(run.trainers[key])
                run.trainers[key].result.graph_breaks = counted[key[0]]
            except Exception as error:  # the count is left empty
                print(f"graph breaks of {key[0]} not counted: {error}", file=sys.stderr)
    return run.report(partial=False)


def _baseline(report: dict[str, Any], mode: str) -> dict[str, Any] | None:
    return next(
        (r for r in report["results"] if r["variant"] == BASELINE and r["mode"] == mode), None
    )


def round_ratios(report: dict[str, Any], a: dict[str, Any], b: dict[str, Any]) -> list[float]:
    """tokens/s of a over b in each round both were timed in (from the rounds' median
    steps): the two ran side by side there, so a drifting machine affects both alike."""
    steps = report["config"]["steps"]

    def medians(r: dict[str, Any]) -> dict[int, float]:
        ms = r["step_ms"]
        per_round = [statistics.median(ms[i : i + steps]) for i in range(0, len(ms), steps)]
        # Reports written before round ids timed every variant in every round.
        ids = r.get("round_ids") or range(len(per_round))
        return dict(zip(ids, per_round, strict=True))

    of_a, of_b = medians(a), medians(b)
    ratios = [of_b[i] / of_a[i] for i in of_a if i in of_b]
    if not ratios:
        raise ValueError(f"{a.get('variant')} and {b.get('variant')} share no round")
    return ratios


def round_ratio(
    report: dict[str, Any], a: dict[str, Any], b: dict[str, Any], digits: int = 2
) -> str:
    """The median of :func:`round_ratios` and their range ("1.04x [0.99-1.07]"): how far
    the run's noise reaches. The targets print 3 digits, so that a verdict at the line
    (0.998x: MISSED) reads as what it is."""
    ratios = round_ratios(report, a, b)
    median, low, high = statistics.median(ratios), min(ratios), max(ratios)
    return f"{median:.{digits}f}x [{low:.{digits}f}-{high:.{digits}f}]"


def _fmt(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def _not_measured(report: dict[str, Any], heading: str) -> str:
    """``"; {heading}: the memory of cofrgenet-f eager, ..."``: the stages of the
    uncompiled pairs timed so far that an unfinished report lacks (the pairs not timed
    are counted beside), or ``""``."""
    cfg, missing = report["config"], []
    # As _run_benchmark measures them: memory in each uncompiled mode, generation in eager.
    for stage, wanted, modes, field_name in (
        ("memory", cfg.get("memory"), UNCOMPILED_MODES, "peak_memory_bytes"),
        ("generation speed", cfg.get("generation"), ("eager",), "gen_cached_tokens_per_s"),
    ):
        lacking = [
            f"{r['variant']} {r['mode']}"
            for r in report["results"]
            if wanted and r["mode"] in modes and r.get(field_name) is None
        ]
        if lacking:
            missing.append(f"the {stage} of {', '.join(lacking)}")
    if cfg.get("memory") and not report.get("layer_activation_bytes_per_token"):
        missing.append("the layers' activation memory")
    return f"; {heading}: {'; '.join(missing)}" if missing else ""


def to_markdown(report: dict[str, Any]) -> str:
    from cofrgenet.bench.timing import BUSY_THRESHOLD, busy_warning

    cfg, peak = report["config"], report["peak_flops"]
    lines = [f"# Training speed ({report['device']}, {report['date']})", ""]
    # Reports written before "pairs" timed every variant in every mode.
    pairs = report.get("pairs", len(cfg["variants"]) * len(cfg["modes"]))
    if report.get("stopped"):
        lines += [
            f"**Stopped** by {report['stopped']}: {len(report['results'])} of {pairs} "
            "variant/mode pairs timed"
            + (
                "; graph breaks not counted (the run counts them last)"
                if set(cfg["modes"]) & set(COMPILE_MODES)
                else ""
            )
            + ". This report holds what the run measured before it stopped"
            + _not_measured(report, "not measured")
            + ".",
            "",
        ]
    elif report.get("partial"):
        lines += [
            f"**Partial report**, written while the run was going: {len(report['results'])} of "
            f"{pairs} variant/mode pairs timed so far"
            + (
                "; graph breaks are counted at the end"
                if set(cfg["modes"]) & set(COMPILE_MODES)
                else ""
            )
            + _not_measured(report, "still to measure")
            + ". The finished run rewrites this file.",
            "",
        ]
    lines += [
        f"- command: `{report['command']}`",
        f"- machine: {report['machine']}; {report['minutes']:.1f} min",
        f"- shape: {cfg['n_layer']} layers x {cfg['n_embd']}, {cfg['n_head']} heads, "
        f"block {cfg['block_size']}, vocab {cfg['vocab_size']}, batch {cfg['batch_size']}, "
        f"{cfg['dtype']}, seed {cfg['seed']}; median of the timed steps, {cfg['steps']} a round, "
        f"{cfg['rounds']} rounds a stage (eager variants and gpt2 in the same mode are also "
        "timed beside each compiled variant)"
        + "".join(f"; {v}: {k} key/value heads" for v, k in report.get("kv_heads", {}).items()),
        f"- peak measured in this run (matmul, {cfg['dtype']}): {peak / 1e9:,.1f} GFLOP/s "
        "(the MFU column's)",
    ]
    loads = [
        r["background_load"] for r in report["results"] if r.get("background_load") is not None
    ]
    if loads:
        lines.append(
            f"- other load (the CPU share other processes used while steps were timed, from "
            f"/proc/stat): up to {max(loads):.0%}; above {BUSY_THRESHOLD:.0%} a figure is "
            "unreliable"
        )
    sheet = report.get("datasheet_peak_flops")
    if sheet:
        lines.append(
            f"- the data sheet's dense peak ({cfg['dtype']}): {sheet / 1e12:,.0f} TFLOP/s "
            "(MFU sheet: the usual MFU)"
        )
    lines += [
        "",
        "| variant | mode | params | train FLOPs/token | tokens/s | vs gpt2 | gpt2 FLOPs / "
        "its FLOPs | speed / FLOPs ratio | GFLOP/s | MFU | MFU sheet | graph breaks | "
        "activations B/token | peak MB above the model |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    above_peak = []  # "variant mode" whose step beat the measured peak: no MFU for them
    for r in report["results"]:
        base = _baseline(report, r["mode"])
        speed = flops = None
        if base is not None:
            speed = r["tokens_per_s"] / base["tokens_per_s"]
            flops = base["flops_per_token"] / r["flops_per_token"]
        achieved = r["tokens_per_s"] * r["flops_per_token"]
        if achieved > peak:
            above_peak.append(f"{r['variant']} {r['mode']}")
        peak_mb = None if r["peak_memory_bytes"] is None else r["peak_memory_bytes"] / 2**20
        lines.append(
            f"| {r['variant']} | {r['mode']} | {r['params']:,} | {r['flops_per_token']:,} | "
            f"{r['tokens_per_s']:,.0f} | {_fmt(speed, '.2f')} | {_fmt(flops, '.2f')} | "
            f"{_fmt(None if speed is None else speed / flops, '.2f')} | "
            f"{achieved / 1e9:,.2f} | {'†' if achieved > peak else f'{achieved / peak:.1%}'} | "
            f"{_fmt(achieved / sheet if sheet else None, '.1%')} | {_fmt(r['graph_breaks'], 'd')} | "
            f"{_fmt(r['activation_bytes_per_token'], ',')} | {_fmt(peak_mb, ',.1f')} |"
        )
    if any(r["peak_memory_bytes"] is not None for r in report["results"]):
        # Not a process's whole peak: the model's weights and the runtime are left out.
        how = (
            "the rise of the CUDA allocator's peak"
            if report["device"] != "cpu"
            else "the rise of a fresh process's peak resident size"
        )
        lines += [
            "",
            "Peak MB above the model: how far memory rose above the built model over three "
            f"training steps (gradients, AdamW state, activations; {how}).",
        ]
    if above_peak:
        # A CPU without native bf16/fp16 matmuls runs the peak's matmul far slower than a
        # step's float32 parts: an MFU over 100% would mean nothing.
        lines += [
            "",
            f"† No MFU: {', '.join(above_peak)} achieved more FLOP/s than the {cfg['dtype']} "
            f"matmul peak measured in this run ({peak / 1e9:,.2f} GFLOP/s), so that matmul is "
            f"no ceiling for {cfg['dtype']} on this device (the JSON keeps the figures: "
            "peak_flops, tokens_per_s, flops_per_token).",
        ]
    busy = busy_warning(
        {f"{r['variant']} {r['mode']}": r.get("background_load") for r in report["results"]},
        "variant/mode pairs",
    )
    if busy:
        lines += ["", f"**Warning:** {busy}"]
    eager = {r["variant"]: r for r in report["results"] if r["mode"] == "eager"}
    for mode in COMPILE_MODES:
        compiled = {r["variant"]: r for r in report["results"] if r["mode"] == mode}
        if compiled and eager:
            lines += ["", f"{mode.capitalize()} against eager (tokens/s ratio of the medians; "
                "per round: median [range]): " + ", ".join(
                f"{v} {compiled[v]['tokens_per_s'] / eager[v]['tokens_per_s']:.2f}x "
                f"(per round {round_ratio(report, compiled[v], eager[v])})"
                for v in compiled if v in eager
            ) + "."]  # fmt: skip
    lines += _recompute_lines(report, eager)
    lines += _profile_lines(report)
    layers = report.get("layer_activation_bytes_per_token") or {}
    if layers:
        lines += [
            "",
            "Activations kept for backward by one layer, bytes per token (input included; "
            f"width {cfg['n_embd']}, {cfg['dtype']}):",
            "",
            "| layer | bytes/token | vs the layer it replaces |",
            "|---|---:|---:|",
        ]
        for label, nbytes in layers.items():
            base = layers.get("mlp") if label.startswith(("mlp", "cffn")) else layers.get("softmax")
            ratio = f"{nbytes / base:.2f}x" if base else ""
            lines.append(f"| {label} | {nbytes:,} | {ratio} |")
    for name, message in (report.get("failed") or {}).items():
        lines += ["", f"**{name} failed**, not timed: `{message}`"]
    lines += ["", *targets(report)]
    gen = [r for r in eager.values() if r["gen_cached_tokens_per_s"] is not None]
    if gen:
        block, prompt = cfg["block_size"], prompt_tokens(cfg["block_size"])
        window = (
            f", each step past {block} tokens reading the last {block} again"
            if prompt + cfg["gen_tokens"] > block
            else ""
        )
        lines += [
            "",
            f"Generation ({cfg['gen_tokens']} tokens after a prompt of {prompt} tokens{window}, "
            f"batch 1, greedy; latency of one token after {block - 1}). Tokens/s are of whole "
            "calls, the prompt's read included (and, cached, the cache's set-up), which a "
            "short generation of a small model spends most of its time on; the latency is "
            "one step's alone:",
            "",
            "| variant | cached tokens/s | recomputed tokens/s | latency cached ms | "
            "latency recomputed ms | latency ratio |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for r in gen:
            lines.append(
                f"| {r['variant']} | {r['gen_cached_tokens_per_s']:,.0f} | "
                f"{r['gen_recompute_tokens_per_s']:,.0f} | {r['latency_cached_ms']:.2f} | "
                f"{r['latency_recompute_ms']:.2f} | "
                f"{r['latency_recompute_ms'] / r['latency_cached_ms']:.1f}x |"
            )
        busy = busy_warning(
            {r["variant"]: r.get("gen_background_load") for r in gen}, "variants' generations"
        )
        if busy:
            lines += ["", f"**Warning:** {busy}"]
    return "\n".join(lines) + "\n"


def _profile_lines(report: dict[str, Any], top: int = 5) -> list[str]:
    """The profiled steps: a table of dispatches and kernels, then each key's costliest
    operators on the host and kernels on the device."""
    profiled = [r for r in report["results"] if r.get("profile")]
    if not profiled:
        return []
    steps = profiled[0]["profile"]["steps"]
    device = any(r["profile"]["kernel_ms"] is not None for r in profiled)
    lines = [
        "",
        f"Where a step goes (torch.profiler over {steps} steps after the timed ones; step ms: "
        "the timed steps' median"
        + (
            "; kernels' share: the kernels' own time over it, so well below 100% the device "
            "waits for the host to queue work):"
            if device
            else "; on a CPU the host runs the kernels itself):"
        ),
        "",
        "| variant | mode | step ms | host dispatches/step |"
        + (" kernels/step | kernel ms/step | kernels' share of the step |" if device else ""),
        "|---|---|---:|---:|" + ("---:|---:|---:|" if device else ""),
    ]
    for r in profiled:
        prof, step_ms = r["profile"], statistics.median(r["step_ms"])
        row = f"| {r['variant']} | {r['mode']} | {step_ms:,.2f} | {prof['dispatches']:,.0f} |"
        if device:
            share = None if prof["kernel_ms"] is None else prof["kernel_ms"] / step_ms
            row += (
                f" {_fmt(prof['kernels'], ',.0f')} | {_fmt(prof['kernel_ms'], ',.2f')} | "
                f"{_fmt(share, '.0%')} |"
            )
        lines.append(row)

    def costliest(entries: list[Any]) -> str:
        return ", ".join(f"`{name}` {ms:,.2f} ({calls:g}x)" for name, ms, calls in entries[:top])

    lines += ["", "Most host time, self (ms a step, calls a step):", ""]
    lines += [
        f"- {r['variant']} {r['mode']}: {costliest(r['profile']['host_top'])}" for r in profiled
    ]
    on_device = [r for r in profiled if r["profile"]["device_top"]]
    if on_device:
        lines += ["", "Most device time (ms a step, launches a step):", ""]
        lines += [
            f"- {r['variant']} {r['mode']}: {costliest(r['profile']['device_top'])}"
            for r in on_device
        ]
    return lines


def _recompute_lines(report: dict[str, Any], eager: dict[str, dict[str, Any]]) -> list[str]:
    """Activation checkpointing against eager: its speed, activations and peak memory."""
    recomputed = {r["variant"]: r for r in report["results"] if r["mode"] == "recompute"}
    pairs = [(v, r, eager[v]) for v, r in recomputed.items() if v in eager and r["step_ms"]]
    if not pairs:
        return []

    def ratio(r: dict[str, Any], e: dict[str, Any], key: str) -> str:
        return f"{r[key] / e[key]:.2f}x" if r[key] is not None and e[key] else "-"

    return [
        "",
        "Recompute (activation checkpointing) against eager (tokens/s per round: median "
        "[range]; activations kept for backward; peak memory above the model): "
        + "; ".join(
            f"{v} {round_ratio(report, r, e)} tokens/s, "
            f"{ratio(r, e, 'activation_bytes_per_token')} activations, "
            f"{ratio(r, e, 'peak_memory_bytes')} peak"
            for v, r, e in pairs
        )
        + ".",
    ]


def unreliable(*timed: dict[str, Any]) -> str:
    """What a verdict adds where other processes loaded the CPU while any of ``timed`` was
    timed (its figures are unreliable, and so is the verdict: `cofr bench ops` flags its
    own alike); nothing on a quiet machine."""
    from cofrgenet.bench.timing import unreliable_note

    return unreliable_note(max((r.get("background_load") or 0.0 for r in timed), default=0.0))


#: A speed verdict where the two ways of reading a run disagree.
UNDECIDED = "undecided"


def speed_verdict(
    report: dict[str, Any], a: dict[str, Any], b: dict[str, Any], at_least: float
) -> str:
    """ "met" or "MISSED" for tokens/s of ``a`` over ``b`` >= ``at_least``, as the median of
    :func:`round_ratios` and the ratio of all steps' medians both say; :data:`UNDECIDED`
    where they disagree (one slow step in one of two rounds moved their median, the mean
    of two, past the line while all steps' ratio stayed far from it)."""
    per_round = statistics.median(round_ratios(report, a, b)) >= at_least
    all_steps = a["tokens_per_s"] / b["tokens_per_s"] >= at_least
    if per_round != all_steps:
        return UNDECIDED
    return "met" if per_round else "MISSED"


def _undecided_note(lines: list[str]) -> list[str]:
    """How to settle the undecided verdicts among ``lines``, if any."""
    if not any(UNDECIDED in line for line in lines):
        return []
    return [
        f"  ({UNDECIDED}: the per-round median and all steps' ratio fall on either side of "
        "the line; rerun with more --rounds, on a quieter machine)"
    ]


def targets(report: dict[str, Any]) -> list[str]:
    """Issue 13's targets, each marked met or missed from this run's numbers (and
    unreliable where the machine was busy while they were timed)."""
    by = {(r["variant"], r["mode"]): r for r in report["results"]}
    lines = ["Targets:", ""]

    def mark(ok: bool) -> str:
        return "met" if ok else "MISSED"

    for mode in ("eager", *COMPILE_MODES):
        f, g = by.get(("cofrgenet-f", mode)), by.get((BASELINE, mode))
        if f and g:
            flops = g["flops_per_token"] / f["flops_per_token"]
            lines.append(
                f"- cofrgenet-f / gpt2 tokens/s ({mode}) >= 0.9 x their FLOPs ratio: per round "
                f"{round_ratio(report, f, g, 3)} vs 0.9 x {flops:.3f} = {0.9 * flops:.3f}: "
                f"{speed_verdict(report, f, g, 0.9 * flops)} (all steps' medians: "
                f"{f['tokens_per_s'] / g['tokens_per_s']:.2f}){unreliable(f, g)}"
            )
    f, g = by.get(("cofrgenet-f", "eager")), by.get((BASELINE, "eager"))
    # A partial report may hold one's peak and not yet the other's.
    if f and g and f["peak_memory_bytes"] is not None and g["peak_memory_bytes"] is not None:
        lines.append(
            f"- cofrgenet-f peak memory above the model <= gpt2's: "
            f"{f['peak_memory_bytes'] / 2**20:,.1f} MB vs "
            f"{g['peak_memory_bytes'] / 2**20:,.1f} MB: "
            f"{mark(f['peak_memory_bytes'] <= g['peak_memory_bytes'])}"
        )
    pairs = {  # "gpt2" for compiled, "gpt2 cudagraphs" for the other compiled mode
        v if m == "compiled" else f"{v} {m}": (r, by[(v, "eager")])
        for (v, m), r in by.items()
        if m in COMPILE_MODES and (v, "eager") in by
    }
    verdicts = {v: speed_verdict(report, c, e, 1.0) for v, (c, e) in pairs.items()}
    if pairs:
        apart = [
            f"{verdict} for {', '.join(v for v, said in verdicts.items() if said == verdict)}"
            for verdict in ("MISSED", UNDECIDED)
            if verdict in verdicts.values()
        ]
        lines.append(
            "- compiled never slower than eager (per-round median ratio): "
            + ("; ".join(apart) or mark(True))
            + " ("
            + ", ".join(f"{v} {round_ratio(report, c, e, 3)}" for v, (c, e) in pairs.items())
            + ")"
            + unreliable(*(r for pair in pairs.values() for r in pair))
        )
    lines += gpu_targets(report, by, mark)
    if len(lines) == 2:  # no verdict: an empty heading would read as a report cut short
        return [
            "Targets: none in this run (they compare cofrgenet-f with gpt2, both in "
            "--variants, and compiled with eager, both in --modes)"
        ]
    lines.append(
        "  (per round: the ratio of each interleaved round's median steps; median [range] "
        "over the rounds)"
    )
    return lines + _undecided_note(lines)


def gpu_targets(
    report: dict[str, Any], by: dict[tuple[str, str], dict[str, Any]], mark: Callable[[bool], str]
) -> list[str]:
    """Issue 13's GPU targets, on a GPU whose data-sheet peak is known: cofrgenet-f
    >= 1.2x gpt2's tokens/s and compiled >= 1.3x eager (both compiled, per-round medians),
    gpt2's compiled MFU against the data sheet >= 40%; for each compiled mode timed."""
    sheet = report.get("datasheet_peak_flops")
    if not sheet:
        return []
    lines = []
    for mode in COMPILE_MODES:
        f, g = by.get(("cofrgenet-f", mode)), by.get((BASELINE, mode))
        if f and g:
            lines.append(
                f"- GPU: cofrgenet-f / gpt2 tokens/s ({mode}) >= 1.2: per round "
                f"{round_ratio(report, f, g, 3)}: {speed_verdict(report, f, g, 1.2)}"
                f"{unreliable(f, g)}"
            )
        for variant in (BASELINE, "cofrgenet-f"):
            c, e = by.get((variant, mode)), by.get((variant, "eager"))
            if c and e:
                lines.append(
                    f"- GPU: {variant} {mode} / eager tokens/s >= 1.3: per round "
                    f"{round_ratio(report, c, e, 3)}: {speed_verdict(report, c, e, 1.3)}"
                    f"{unreliable(c, e)}"
                )
        if g:
            used = g["tokens_per_s"] * g["flops_per_token"] / sheet
            lines.append(
                f"- GPU: gpt2 MFU ({mode}, data sheet) >= 40%: {used:.1%}: {mark(used >= 0.4)}"
                f"{unreliable(g)}"
            )
    return lines


def report_stem(report: dict[str, Any], out_dir: Path) -> Path:
    """``out_dir/train-<device>-<date>[-<tag>]``, or with ``-2``, ``-3``, ... when a report
    of that name is there already: a run never replaces another's report."""
    # cpu, or the GPU's name as a slug (train-nvidia-h200-2026-12-01), as `cofr bench ops`.
    device = name_slug(report["device"])
    tag = report["config"].get("tag")
    return free_stem(out_dir, f"train-{device}-{report['date']}{f'-{tag}' if tag else ''}")


def write_report(
    report: dict[str, Any], out_dir: Path, stem: Path | None = None
) -> tuple[Path, Path]:
    """Write the report as ``<stem>.md`` and ``<stem>.json`` (default: a new
    :func:`report_stem`); a run passes its stem to rewrite its own report as it goes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = report_stem(report, out_dir) if stem is None else stem
    md, js = with_suffix(stem, ".md"), with_suffix(stem, ".json")
    write_text_atomic(md, to_markdown(report))
    write_text_atomic(js, json.dumps(report, indent=2) + "\n")
    return md, js


#: ``--quick``'s settings, under the options given: every default variant eager at a tiny
#: shape, a smoke test of a minute or so (as ``cofr bench ops --quick``).
QUICK: dict[str, Any] = {
    "modes": ("eager",),
    "n_layer": 1,
    "n_embd": 32,
    "n_head": 2,
    "block_size": 32,
    "vocab_size": 64,
    "batch_size": 2,
    "steps": 2,
    "warmup": 1,
    "rounds": 2,
    "gen_tokens": 4,
    "profile_steps": 0,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Options stay out of the namespace unless given, so --quick can fill the rest.
    add_dataclass_arguments(
        parser.add_argument_group("what to time"), TrainBenchConfig, given_only=True
    )
    output = parser.add_argument_group("run and output")
    output.add_argument(
        "--quick",
        action="store_true",
        help="a tiny shape, eager only, two rounds of two steps (a minute or so: a smoke "
        "test), for the options not given; its report is saved with the tag quick",
    )
    output.add_argument(
        "--save",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write the report files (--no-save: print the table only)",
    )


def config_from_args(args: argparse.Namespace) -> TrainBenchConfig:
    """The config of the options given, over ``--quick``'s (tagged ``quick``, before any
    ``--tag``, as bench ops' and quality's) or the defaults."""
    quick = getattr(args, "quick", False)
    base = replace(TrainBenchConfig(), **QUICK) if quick else TrainBenchConfig()
    cfg = dataclass_from_args(TrainBenchConfig, args, base=base)
    if quick and cfg.tag != "quick":
        cfg = replace(cfg, tag="-".join(t for t in ("quick", cfg.tag) if t))
    return cfg


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    saving = getattr(args, "save", True)
    check_settings(cfg)
    unmeasured = [
        what
        for what, asked, modes in (
            ("memory", cfg.memory, UNCOMPILED_MODES),
            ("generation", cfg.generation, ("eager",)),
        )
        if asked and not set(cfg.modes) & set(modes)
    ]
    if unmeasured:
        print(f"note: {' and '.join(unmeasured)} measured on the uncompiled trainers only "
              f"(memory: eager or recompute; generation: eager): none here "
              f"(--modes {','.join(cfg.modes)})", file=sys.stderr)  # fmt: skip
    if cfg.dtype != "float32" and not cfg.device.startswith("cuda"):
        print(f"warning: --dtype {cfg.dtype} on {cfg.device}: a CPU without native {cfg.dtype} "
              "matmuls runs them far slower than float32 ones, so its timings and MFU say "
              "little; --dtype float32 for CPU figures", file=sys.stderr)  # fmt: skip
    command = getattr(args, "command_line", "cofr bench train")
    if not saving:
        return _run_printing_only(cfg, command)
    out_dir = make_out_dir(cfg.out_dir)  # now: a folder it cannot write fails before the work
    pairs = len(timed_keys(cfg))
    stem = stem_once(lambda report: report_stem(report, out_dir))

    def save(report: dict[str, Any]) -> tuple[Path, Path]:
        return write_report(report, out_dir, stem(report))

    # The latest partial report written and its .md; the line said of it last.
    written: list[tuple[dict[str, Any], Path]] = []
    said: list[str] = []

    def save_partial(report: dict[str, Any]) -> None:
        md, _ = save(report)
        written[:] = [(report, md)]
        pending = report.get("graph_breaks_pending")
        what = "report, graph breaks to count" if pending else "partial report"
        line = f"{what}, {len(report['results'])} of {pairs} timed: {md}"
        if said != [line]:  # a memory or generation stage times no new pair: said once
            print(line, flush=True)
            said[:] = [line]

    report = measure_keeping_partial(
        lambda: run_benchmark(cfg, command, on_update=save_partial),
        written,
        lambda partial, why: save({**partial, "stopped": why}),
    )
    md, js = save(report)
    print(to_markdown(report))
    print(f"wrote {md} and {js}")
    return 1 if report.get("failed") else 0


def _run_printing_only(cfg: TrainBenchConfig, command: str) -> int:
    """``--no-save``: the report's table printed, no file written; a run stopped early
    (Ctrl-C, SIGTERM, an error) prints what it had timed, marked stopped."""
    latest: list[tuple[dict[str, Any], None]] = []

    def keep(partial: dict[str, Any]) -> None:
        latest[:] = [(partial, None)]

    report = measure_keeping_partial(
        lambda: run_benchmark(cfg, command, on_update=keep),
        latest,
        lambda partial, why: print(to_markdown({**partial, "stopped": why})),
        saving=False,
    )
    print(to_markdown(report))
    return 1 if report.get("failed") else 0
