"""The lm-evaluation-harness model ``cofrgenet``: any ``cofr fit`` checkpoint on harness tasks.

Three ways in:

* ``cofr eval --harness TASKS`` (through :func:`run_harness`);
* ``python -m cofrgenet.eval.harness --model cofrgenet --model_args ckpt=RUN/last.ckpt
  --tasks arc_easy`` (lm_eval's own command line, with the model registered first);
* ``import cofrgenet.eval.harness`` in Python, then ``lm_eval.simple_evaluate(model=
  "cofrgenet", model_args={"ckpt": ...}, ...)`` or ``CofrgenetLM(ckpt=...)``.

``lm_eval`` is an optional dependency and slow to import, so nothing here imports more
than its registry (about 40 ms) until a model is built: :class:`CofrgenetLM` subclasses
``lm_eval.api.model.TemplateLM`` and is made on first use (module ``__getattr__``).

Conventions (those of the harness's Hugging Face model, ``lm_eval.models.huggingface``):

* loglikelihood: the context's trailing whitespace moves onto the continuation, the pair
  is encoded as the harness does for causal models (``TemplateLM._encode_pair``), an empty
  context becomes the EOS token, and ``context + continuation`` is cut from the left to
  ``max_length + 1`` tokens. Every continuation token is scored: one longer than
  ``max_length`` is scored in consecutive disjoint windows (as loglikelihood_rolling),
  each reading ``max_length`` ids.
* loglikelihood_rolling: EOS, then the text in disjoint windows of ``max_length``
  (``get_rolling_token_windows`` + ``make_disjoint_window``); each token is scored once.
* generate_until: the prompt's last ``max_length`` tokens, then token by token with the
  context sliding like ``cofr generate`` (each token drawn by ``nn.decoding.sample_next``,
  as there; :func:`decode` is this module's own loop, since it stops on strings and drops
  finished rows), until a stop string (or EOS) or ``max_gen_toks``. Greedy by default;
  ``do_sample`` / ``temperature`` / ``top_k`` / ``top_p`` sample, seeded by the model
  argument ``seed``.

Log-probabilities are the model's own: a softmax over all its logits, padded vocabulary
included (as in training). Ids the tokenizer does not have (a vocabulary padded to a
multiple of 64) are never generated, nor count as the greedy choice.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cofrgenet.errors import UserError, did_you_mean, first_line
from cofrgenet.hub import offline_unless_reachable

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from cofrgenet.data import Tokenizer
    from cofrgenet.training.pretrained import LoadedCheckpoint

log = logging.getLogger(__name__)

#: The name under which lm_eval finds the model (``--model cofrgenet``).
MODEL_NAME = "cofrgenet"
#: This module's import name (also when run as ``python -m cofrgenet.eval.harness``).
MODULE = "cofrgenet.eval.harness"
#: Where lm_eval's registry finds the class (resolved through this module's __getattr__).
MODEL_TARGET = f"{MODULE}:CofrgenetLM"
#: Batch size for lm_eval's ``--batch_size auto`` (no memory probing here).
AUTO_BATCH_SIZE = 16
DEFAULT_MAX_GEN_TOKS = 256


class HarnessNotInstalled(UserError, ImportError):
    """The optional dependency ``lm_eval`` is missing."""


class HarnessError(UserError, ValueError):
    """A harness task or option the user gave is not valid."""


#: The oldest lm_eval with the registry and generation helpers used here.
LM_EVAL_MIN = "0.4.10"


def _require_lm_eval() -> None:
    try:
        import lm_eval
    except ImportError:
        raise HarnessNotInstalled(
            "the lm-evaluation-harness is not installed: `pip install lm_eval` "
            "(or the project's extra: `pip install -e '.[eval]'`)"
        ) from None
    try:  # added in 0.4.10, with lm_eval.models.utils' generation helpers
        from lm_eval.api.registry import model_registry  # noqa: F401
    except ImportError:
        raise HarnessNotInstalled(
            f"lm_eval {getattr(lm_eval, '__version__', '(unknown version)')} is too old: "
            f"cofr needs lm_eval >= {LM_EVAL_MIN} (`pip install -U 'lm_eval>={LM_EVAL_MIN}'`)"
        ) from None


def register() -> type:
    """Register ``cofrgenet`` with lm_eval's model registry; return the model class.

    Idempotent. lm_eval fills its registry with its own models only when the registry
    is empty, so those are registered first: ``--model hf`` keeps working.
    """
    _require_lm_eval()
    return _lm_class()


def _register_placeholder() -> None:
    """Point lm_eval's registry at :data:`MODEL_TARGET` without building the class."""
    import lm_eval.models  # noqa: F401  (lm_eval's own models, see register())
    from lm_eval.api.registry import model_registry

    if MODEL_NAME not in model_registry:
        model_registry.register(MODEL_NAME, target=MODEL_TARGET)


def __getattr__(name: str) -> Any:
    # The class needs lm_eval's base class, so it is made on first access.
    if name == "CofrgenetLM":
        _require_lm_eval()
        return _lm_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@cache
def _lm_class() -> type:
    """``CofrgenetLM``: :class:`_CofrgenetLMImpl` on lm_eval's ``TemplateLM``, registered."""
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model

    _register_placeholder()  # lm_eval's own models first (see register())
    cls = type(
        "CofrgenetLM",
        (_CofrgenetLMImpl, TemplateLM),
        {"__module__": MODULE, "__doc__": _CofrgenetLMImpl.__doc__},
    )
    # Replaces the placeholder (same "module:name") in the registry, or registers anew.
    return register_model(MODEL_NAME)(cls)


def _int_or_auto(value: int | str | None, default: int) -> int:
    """lm_eval passes batch sizes as ints or strings ("8", "auto", "auto:4")."""
    if value is None:
        return default
    if isinstance(value, str) and value.startswith("auto"):
        return AUTO_BATCH_SIZE
    size = int(value)
    if size < 1:
        raise HarnessError(f"batch_size must be at least 1, got {size}")
    return size


def usable_device(device: str | None) -> str:
    """``device``, or ``cuda`` where torch sees a GPU and ``cpu`` elsewhere when it is
    None, or when it names CUDA on a machine without it: lm_eval's command line passes
    its own default, ``cuda:0``, whatever the machine (said in a warning)."""
    import torch

    if device and device.startswith("cuda") and not torch.cuda.is_available():
        log.warning("cofrgenet model: device %s, but torch sees no CUDA device: cpu", device)
        return "cpu"
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


class _CofrgenetLMImpl:
    """lm_eval model over a ``cofr fit`` checkpoint (``--model cofrgenet``).

    Model arguments: ``ckpt`` (required; or ``pretrained``, lm_eval's name, which its
    ``--output_path`` names the results folder after), ``tokenizer_dir`` (a prepared data folder whose
    tokenizer to use), ``device``, ``batch_size``, ``max_length`` (default: the length the
    model trained at, else its block_size; longer only for recurrent models), ``max_gen_toks`` (256) and ``seed`` (1234, for
    sampled generation).
    """

    backend = "causal"

    @classmethod
    def create_from_arg_string(
        cls, arg_string: str, additional_config: dict[str, Any] | None = None
    ) -> Any:
        """lm_eval's, with ``--model_args`` winning over its command line's own
        ``--device``/``--batch_size`` (their defaults included): lm_eval passes both, and
        ``device=`` in the model arguments was a "multiple values" traceback."""
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(
        cls, arg_dict: dict[str, Any], additional_config: dict[str, Any] | None = None
    ) -> Any:
        given = {k: v for k, v in (additional_config or {}).items() if v is not None}
        return cls(**{**given, **arg_dict})

    def __init__(
        self,
        ckpt: str | Path | None = None,
        device: str | None = None,
        batch_size: int | str | None = 8,
        max_batch_size: int | None = None,
        tokenizer_dir: str | None = None,
        max_length: int | None = None,
        max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
        seed: int = 1234,
        pretrained: str | Path | None = None,
        **unused: Any,
    ) -> None:

        super().__init__()  # type: ignore[call-arg]  # lm_eval's LM: rank, cache hook
        if unused:
            log.warning("cofrgenet model: ignoring unknown model arguments %s", sorted(unused))
        same = (
            ckpt is None or pretrained is None or Path(ckpt).resolve() == Path(pretrained).resolve()
        )
        if not same:
            raise HarnessError(
                f"the cofrgenet model got two checkpoints, ckpt={ckpt} and "
                f"pretrained={pretrained}: give one"
            )
        ckpt = ckpt if ckpt is not None else pretrained
        if ckpt is None:
            raise HarnessError(
                "the cofrgenet model needs a checkpoint: --model_args pretrained=PATH "
                "(or ckpt=PATH)"
            )
        from cofrgenet.training.pretrained import load_checkpoint

        device = usable_device(device)
        loaded = load_checkpoint(
            ckpt, device=device, tokenizer_dir=tokenizer_dir, tokenizer_option="tokenizer_dir"
        )
        self._setup(
            loaded.model,
            loaded.tokenizer,
            loaded.block_size,
            device=device,
            batch_size=batch_size,
            max_length=max_length or loaded.context_length,
            max_gen_toks=max_gen_toks,
            seed=seed,
        )
        self.ckpt = str(ckpt)

    @classmethod
    def from_model(
        cls,
        model: nn.Module,
        tokenizer: Tokenizer,
        block_size: int,
        *,
        device: str = "cpu",
        batch_size: int | str | None = 8,
        max_length: int | None = None,
        max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
        seed: int = 1234,
        ckpt: str | None = None,
    ) -> Any:
        """Wrap a model already in memory (a loaded checkpoint, tests, notebooks) instead
        of a checkpoint file; ``ckpt``: the file it came from, for lm_eval's report."""
        self = cls.__new__(cls)
        super(_CofrgenetLMImpl, self).__init__()  # type: ignore[misc]  # lm_eval's LM
        self._setup(
            model.to(device).eval(),
            tokenizer,
            block_size,
            device=device,
            batch_size=batch_size,
            max_length=max_length,
            max_gen_toks=max_gen_toks,
            seed=seed,
        )
        self.ckpt = ckpt
        return self

    def _setup(
        self,
        model: nn.Module,
        tokenizer: Tokenizer,
        block_size: int,
        *,
        device: str,
        batch_size: int | str | None,
        max_length: int | None,
        max_gen_toks: int,
        seed: int,
    ) -> None:
        import torch

        from cofrgenet.models.generation import is_recurrent

        self.model = model
        self.tokenizer = tokenizer
        self._device = torch.device(device)
        self.batch_size = _int_or_auto(batch_size, 8)
        # Recurrent models read any length; transformers at most block_size positions.
        self.recurrent = is_recurrent(model)
        length = int(max_length) if max_length is not None else int(block_size)
        if length > block_size and not self.recurrent:
            raise HarnessError(
                f"max_length {length} exceeds the model's block_size {block_size}: a "
                "transformer reads at most block_size positions"
            )
        self.max_length = length
        self.max_gen_toks = int(max_gen_toks)
        self.seed = int(seed)
        #: Requests scored, and tokens drawn, from NaN outputs (NaN or inf weights):
        #: lm_eval's argmax over NaN picks the first choice, a plausible accuracy
        #: (:func:`run_harness` makes such scores NaN). An -inf log-likelihood (a
        #: diverged model's huge logits) is a score, as cofr's own sets take it.
        self.not_finite = 0

    # -- lm_eval's TemplateLM interface ------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_id

    @property
    def tokenizer_name(self) -> str:
        return f"cofrgenet-{self.tokenizer.kind}-{self.tokenizer.vocab_size}"

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **kwargs: Any
    ) -> list[int]:
        # Our tokenizers add no special tokens; EOS (the prefix) is added by the callers.
        return self.tokenizer.encode(string)

    def tok_decode(self, tokens: Sequence[int], **kwargs: Any) -> str:
        return self.tokenizer.decode(tokens)

    def get_model_info(self) -> dict[str, Any]:
        """Recorded by lm_eval in the results' ``config``."""
        return {
            "model_num_parameters": sum(p.numel() for p in self.model.parameters()),
            "ckpt": self.ckpt,
            "max_length": self.max_length,
        }

    @property
    def _n_real(self) -> int:
        """Ids below this are the tokenizer's; the rest pad the model's vocabulary."""
        return self.tokenizer.vocab_size

    # -- scoring -----------------------------------------------------------------------

    def _score_sequences(
        self, requests: Sequence[tuple[list[int], list[int]]], disable_tqdm: bool = True
    ) -> list[tuple[float, bool]]:
        """(log P(continuation | context), is greedy) of token (context, continuation) pairs."""
        from tqdm import tqdm

        from cofrgenet.eval.scoring import score_continuations

        with tqdm(disable=disable_tqdm, desc="Scoring windows") as bar:

            def progress(n: int, total: int) -> None:
                bar.total = total
                bar.update(n)

            scores = score_continuations(
                self.model,
                requests,
                self.max_length,
                self.batch_size,
                self._device,
                n_real=self._n_real,
                pad_id=self.eot_token_id,
                on_batch=progress,
            )
        self.not_finite += sum(math.isnan(logprob) for logprob, _ in scores)
        return scores

    def _loglikelihood_tokens(
        self,
        requests: list[tuple[tuple[str, str], list[int], list[int]]],
        disable_tqdm: bool = False,
        **kwargs: Any,
    ) -> list[tuple[float, bool]]:
        # A context of whitespace only ("\n") leaves no context ids once lm-eval has moved
        # its trailing whitespace into the continuation: EOS stands in, as for "".
        results = self._score_sequences(
            [(ctx or [self.eot_token_id], cont) for _, ctx, cont in requests],
            disable_tqdm=disable_tqdm,
        )
        for (request, _, _), answer in zip(requests, results, strict=True):
            if request is not None:
                self.cache_hook.add_partial("loglikelihood", request, answer)
        return results

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of each whole text, from EOS, in disjoint ``max_length`` windows."""
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        pairs: list[tuple[list[int], list[int]]] = []
        owner: list[int] = []
        for k, (string,) in enumerate(req.args for req in requests):
            for context, continuation in map(
                make_disjoint_window,
                get_rolling_token_windows(
                    token_list=self.tok_encode(string),
                    prefix_token=self.eot_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                ),
            ):
                pairs.append((context, continuation))
                owner.append(k)
        scores = self._score_sequences(pairs, disable_tqdm=disable_tqdm)
        totals = [0.0] * len(requests)
        for k, (lp, _) in zip(owner, scores, strict=True):
            totals[k] += lp
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # -- generation --------------------------------------------------------------------

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Continue each context until a stop string, EOS or ``max_gen_toks`` tokens.

        Requests are batched by (generation arguments, prompt length): the models take
        no attention mask, so a batch's prompts must be the same length.
        """
        import torch
        from lm_eval.models.utils import (
            handle_stop_sequences,
            normalize_gen_kwargs,
            postprocess_generated_text,
        )
        from tqdm import tqdm

        generator = torch.Generator(device=self._device).manual_seed(self.seed)
        eos_text = self.tok_decode([self.eot_token_id])
        prepared = []
        for context, gen_kwargs in (req.args for req in requests):
            kwargs = dict(normalize_gen_kwargs(dict(gen_kwargs), self.max_gen_toks))
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos_text)
            ids = self.tok_encode(context)[-self.max_length :] or [self.eot_token_id]
            prepared.append((ids, until, kwargs))

        def group_key(i: int) -> tuple[int, str]:
            ids, until, kwargs = prepared[i]
            return (-len(ids), repr((until, sorted(kwargs.items(), key=str))))

        order = sorted(range(len(requests)), key=group_key)
        out: list[str] = [""] * len(requests)
        bar = tqdm(total=len(requests), disable=disable_tqdm, desc="Generating")
        at = 0
        while at < len(order):
            key = group_key(order[at])
            batch = [order[at]]
            while (
                at + len(batch) < len(order)
                and len(batch) < self.batch_size
                and group_key(order[at + len(batch)]) == key
            ):
                batch.append(order[at + len(batch)])
            at += len(batch)
            _, until, kwargs = prepared[batch[0]]
            texts = self._generate(
                [prepared[i][0] for i in batch], until, kwargs, generator=generator
            )
            for i, text in zip(batch, texts, strict=True):
                out[i] = postprocess_generated_text(text, stop=until, think_end_token=None)
                self.cache_hook.add_partial("generate_until", requests[i].args, out[i])
            bar.update(len(batch))
        bar.close()
        return out

    def _generate(
        self,
        prompts: list[list[int]],
        until: list[str],
        kwargs: dict[str, Any],
        generator: torch.Generator | None = None,
    ) -> list[str]:
        """Generated text (stop strings not yet cut) of equal-length ``prompts``."""
        import torch

        max_new = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
        do_sample = bool(kwargs.pop("do_sample", False))
        temperature = float(kwargs.pop("temperature", 0.0) or 0.0)
        if not do_sample and temperature > 0:  # greedy: a temperature would be ignored
            kwargs["temperature"] = temperature
        temperature = temperature if do_sample else 0.0
        top_k = kwargs.pop("top_k", None)
        top_p = kwargs.pop("top_p", None)
        ignored = {k: v for k, v in kwargs.items() if k not in ("max_length",)}
        if ignored:
            log.warning("cofrgenet model: ignoring generation arguments %s", ignored)

        def choose(logits: Tensor) -> Tensor:  # as cofr generate draws; no padded id
            from cofrgenet.nn.decoding import sample_next

            # NaN, or +inf (its argmax a token drawn from no distribution).
            real = logits[..., : self._n_real]
            self.not_finite += int((real.isnan() | real.isposinf()).any())
            return sample_next(
                logits,
                temperature,
                top_k=None if top_k in (None, 0) else int(top_k),
                generator=generator,
                top_p=None if top_p in (None, 1, 1.0) else float(top_p),
                vocab=self._n_real,
            )

        def stopped(tokens: list[int]) -> bool:
            text = self.tok_decode(tokens)
            return any(s and s in text for s in until)

        from cofrgenet.models.generation import decode_until

        idx = torch.tensor(prompts, dtype=torch.long, device=self._device)
        with torch.no_grad():
            new = decode_until(self.model, idx, max_new, self.max_length, choose, stopped)
        return [self.tok_decode(tokens) for tokens in new]


# -- cofr eval --harness -------------------------------------------------------------------


def _expand_tasks(task_manager: Any, tasks: Sequence[str]) -> list[str]:
    """Task names (globs expanded, YAML paths kept); a UserError for unknown ones."""
    names: list[str] = []
    for task in tasks:
        if any(c in task for c in "*?["):
            matched = task_manager.match_tasks([task])
            if not matched:
                raise HarnessError(f"no harness task matches {task!r}")
            names += matched
        elif task in task_manager.all_tasks or (
            task.endswith((".yaml", ".yml")) and Path(task).is_file()
        ):
            names.append(task)
        else:
            raise HarnessError(
                f"unknown harness task {task!r}{did_you_mean(task, task_manager.all_tasks)}; "
                "`lm_eval ls tasks` lists them, and --include-path DIR adds a folder of task YAMLs"
            )
    return names


def _scored_as(task: str) -> str:
    """The name a task's results go by: a YAML path's own ``task:`` (``myt/ptb.yaml``
    with ``task: ptb`` is scored as ``ptb``), else the name given."""
    if not task.endswith((".yaml", ".yml")):
        return task
    try:  # a regex, not a YAML load: lm-eval's files hold `!function` tags
        found = re.search(r"^task:\s*['\"]?([^\s'\"#]+)", Path(task).read_text(), re.MULTILINE)
    except (OSError, UnicodeDecodeError):
        return task
    return found.group(1) if found else task


def flatten_results(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``{task: {metric: value}}`` from ``simple_evaluate``'s ``results["results"]``.

    lm_eval keys metrics ``"acc,none"`` (metric, filter): the ``none`` filter is dropped,
    others become ``"exact_match/strict-match"`` (MLflow metric names take no commas).
    Non-numbers (aliases, "N/A" standard errors) are left out. A task scored with
    few-shot examples is keyed ``"<task>/<n>shot"`` (its metrics ``eval/arc_easy/5shot/acc``):
    a 5-shot accuracy is another number than the 0-shot one, never its replacement. A
    perplexity task (``loglikelihood_rolling``) takes no examples whatever its shots say:
    keyed by its name alone (its 2-shot numbers were its 0-shot ones).
    """
    shots = results.get("n-shot", {})
    configs = results.get("configs", {})
    flat: dict[str, dict[str, float]] = {}
    for task, metrics in results.get("results", {}).items():
        row: dict[str, float] = {}
        for key, value in metrics.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            metric, _, filter_name = key.partition(",")
            name = metric if filter_name in ("", "none") else f"{metric}/{filter_name}"
            row[name] = float(value)
        n_shot = shots.get(task)
        if (configs.get(task) or {}).get("output_type") == "loglikelihood_rolling":
            n_shot = 0
        flat[f"{task}/{n_shot}shot" if isinstance(n_shot, int) and n_shot > 0 else task] = row
    return flat


@dataclass(frozen=True)
class ResolvedTasks:
    """Harness task names checked against lm_eval's index (globs expanded), with the
    index itself: building it reads every task YAML (seconds), so it is done once."""

    names: list[str]
    task_manager: Any


def resolve_tasks(
    tasks: Sequence[str], include_path: str | None = None, reserved: Sequence[str] = ()
) -> ResolvedTasks:
    """Check ``tasks`` before any work: lm_eval installed, ``include_path`` a folder, every
    name known, and none in ``reserved`` (names whose results would be replaced)."""
    offline_unless_reachable()  # before lm_eval imports the hub's client: no retries
    _require_lm_eval()
    if not tasks:
        raise HarnessError("no harness tasks given")
    if include_path is not None and not Path(include_path).is_dir():
        raise HarnessError(f"--include-path {include_path!r} is not a folder")
    from lm_eval.tasks import TaskManager

    register()
    task_manager = TaskManager(include_path=include_path)
    names = _expand_tasks(task_manager, tasks)
    clash = [name for name in map(_scored_as, names) if name in reserved]
    if clash:
        # lm-eval's own tasks of the set go by other names (lambada_openai, ...).
        variants = sorted(
            n for n in task_manager.all_tasks if n.startswith(f"{clash[0]}_") and n.count("_") == 1
        )
        way = f"lm-eval's own are {', '.join(variants[:4])}; " if variants else ""
        raise HarnessError(
            f"harness task {clash[0]!r} has the name of cofr's own {clash[0]} task, whose "
            f"results and MLflow metrics it would replace: {way}--tasks {clash[0]} scores "
            "cofr's; a task of your own: give it another name (the `task:` of its YAML)"
        )
    return ResolvedTasks(names, task_manager)


def run_harness(
    ckpt: str | Path | LoadedCheckpoint,
    tasks: Sequence[str] | ResolvedTasks,
    *,
    include_path: str | None = None,
    limit: int | float | None = None,
    batch_size: int = 8,
    device: str = "cpu",
    num_fewshot: int | None = None,
    tokenizer_dir: str | None = None,
    bootstrap_iters: int = 1000,
    seed: int = 1234,
    max_length: int | None = None,
) -> dict[str, dict[str, float]]:
    """{task: {metric: value}} from lm_eval.simple_evaluate through the cofrgenet LM.

    ckpt: a checkpoint file, or one loaded already (``cofr eval`` scores its own sets with
    it: the model is not loaded twice; ``tokenizer_dir`` is then the one it was loaded with).

    include_path: a folder of extra task YAMLs (lm_eval's ``--include_path``), added to
    lm_eval's own tasks (one of the same name replaces lm_eval's). ``tasks`` may also
    hold globs (``arc_*``) and YAML file paths, or be :func:`resolve_tasks`'s answer
    (``include_path`` is then the one given there).
    bootstrap_iters: resamples for the standard errors of non-mean metrics (perplexities;
    lm_eval's default 100000 takes minutes); 0 skips them.
    max_length: tokens of context per request (default: the length the model trained
    at, else its block size).

    A model whose outputs were not finite for any request (NaN or inf weights) gets NaN
    for every score: lm_eval's choices over NaN log-likelihoods read as an accuracy.
    """
    resolved = tasks if isinstance(tasks, ResolvedTasks) else resolve_tasks(tasks, include_path)
    from lm_eval import simple_evaluate

    if isinstance(ckpt, (str, Path)):
        lm = _lm_class()(
            ckpt=str(ckpt),
            device=device,
            batch_size=batch_size,
            tokenizer_dir=tokenizer_dir,
            seed=seed,
            max_length=max_length,
        )
    else:
        lm = _lm_class().from_model(
            ckpt.model,
            ckpt.tokenizer,
            ckpt.block_size,
            device=device,
            batch_size=batch_size,
            seed=seed,
            ckpt=str(ckpt.path),
            max_length=max_length or ckpt.context_length,
        )
    try:
        results = simple_evaluate(
            model=lm,
            tasks=resolved.names,
            num_fewshot=num_fewshot,
            limit=limit,
            task_manager=resolved.task_manager,
            bootstrap_iters=bootstrap_iters,
            log_samples=False,
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
        )
    except ValueError as error:  # random.sample's, drawing the examples
        if num_fewshot and "larger than population" in str(error):
            raise HarnessError(
                f"--num-fewshot {num_fewshot}: {_which_task(resolved.names)} fewer documents "
                "than that to draw its examples from (its fewshot split, else its other "
                "documents); give fewer"
            ) from None
        raise
    except ConnectionError as error:  # datasets' "Couldn't reach '<name>' on the Hub"
        reason = first_line(error) or "no network"
        raise HarnessError(
            f"a task's dataset is neither cached nor reachable: {reason}; run it once where "
            "the Hugging Face hub answers (the cache then serves it), or give the data as "
            "a local task (--include-path)"
        ) from None
    if results is None:  # only on non-zero ranks of a distributed run
        return {}
    scores = flatten_results(results)
    if lm.not_finite:  # which task's requests is not known: every score is void
        log.warning(
            "cofrgenet model: %d requests or decoding steps had NaN outputs: every harness "
            "score is NaN",
            lm.not_finite,
        )
        return {task: dict.fromkeys(metrics, math.nan) for task, metrics in scores.items()}
    return scores


def _which_task(names: Sequence[str]) -> str:
    """``task has`` for one task asked, ``one of a, b, c has`` for a few, else their count."""
    if len(names) == 1:
        return f"{names[0]} has"
    shown = ", ".join(names) if len(names) <= 5 else f"the {len(names)} tasks asked"
    return f"one of {shown} has"


def main(argv: list[str] | None = None) -> None:
    """lm_eval's command line with the ``cofrgenet`` model registered:
    ``python -m cofrgenet.eval.harness --model cofrgenet --model_args ckpt=... --tasks ...``.
    """
    register()
    from lm_eval.__main__ import cli_evaluate

    saved = sys.argv
    if argv is not None:  # lm_eval's parser reads sys.argv only
        sys.argv = [sys.argv[0], *argv]
    try:
        cli_evaluate()
    except UserError as error:  # a missing checkpoint, another tokenizer...: one line
        print(f"python -m {MODULE}: error: {error}", file=sys.stderr)
        raise SystemExit(error.exit_status) from None
    finally:
        sys.argv = saved


# Importing this module makes ``--model cofrgenet`` known to lm_eval when it is installed
# (its registry is cheap to import; the model class is built on first use).
with contextlib.suppress(ImportError):
    _register_placeholder()


if __name__ == "__main__":
    # Run the imported module's main, so that the class lives in cofrgenet.eval.harness.
    import importlib

    importlib.import_module(MODULE).main()
