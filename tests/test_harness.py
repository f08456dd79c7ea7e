"""The lm-evaluation-harness model ``cofrgenet`` (cofrgenet.eval.harness), offline.

Scores are checked against the model called directly; the end-to-end runs use the task
YAMLs of tests/data/harness (local files through ``custom_dataset``) and one written
here that loads a jsonl with ``dataset_path: json``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from eval_helpers import tiny_byte_data, trained_checkpoint

pytest.importorskip("lm_eval")

from cofrgenet.data import ByteTokenizer
from cofrgenet.data.tokenizer import EOS_TEXT
from cofrgenet.errors import UserError
from cofrgenet.eval import harness
from cofrgenet.eval.harness import HarnessError, HarnessNotInstalled, run_harness
from cofrgenet.models import ModelConfig, build_model
from cofrgenet.models.generation import decode_until
from cofrgenet.nn.decoding import sample_next
from cofrgenet.training.generate import sample

TASKS = Path(__file__).resolve().parent / "data" / "harness"
BLOCK = 32  # trained_checkpoint's block_size
BYTES = ByteTokenizer()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("harness")
    return trained_checkpoint(root, tiny_byte_data(root / "data"), preset="gpt2-tiny-f", steps=2)


@pytest.fixture(scope="module")
def lm(ckpt: Path):
    return harness.CofrgenetLM(ckpt=str(ckpt), device="cpu", batch_size=3)


def requests(*args: tuple) -> list[SimpleNamespace]:
    """Stand-ins for lm_eval Instances: the adapter reads only ``.args``."""
    return [SimpleNamespace(args=a) for a in args]


def direct_logprob(model: nn.Module, inputs: list[int], targets: list[int]) -> float:
    """Sum of log-softmax at the last len(targets) positions of ``model(inputs)``."""
    with torch.no_grad():
        logits = model(torch.tensor([inputs]))[0].float()
    lp = torch.log_softmax(logits, dim=-1)[len(inputs) - len(targets) :]
    return float(lp[torch.arange(len(targets)), torch.tensor(targets)].sum())


class VocabMasked(nn.Module):
    """``model`` whose logits past the tokenizer's vocabulary are -inf (greedy reference)."""

    def __init__(self, model: nn.Module, n_real: int) -> None:
        super().__init__()
        self.inner, self.n_real = model, n_real

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        logits = self.inner(idx).clone()
        logits[..., self.n_real :] = float("-inf")
        return logits


# -- loglikelihood ---------------------------------------------------------------------


def test_loglikelihood_equals_the_model_called_directly(lm):
    long_context = "The for statement iterates over a sequence, one item at a time. " * 2
    assert len(long_context) > BLOCK
    reqs = [
        ("Question: what defines a function?\nAnswer:", " def"),
        ("x = 1 + ", "2"),  # the trailing space moves onto the continuation
        (long_context, " and stops."),  # context cut from the left
        ("", "hello"),  # empty context: EOS
    ]
    got = lm.loglikelihood(requests(*reqs))
    for (context, continuation), (logprob, is_greedy) in zip(reqs, got, strict=True):
        n_space = len(context) - len(context.rstrip())
        if context:
            ctx, cont = context[: len(context) - n_space], context[len(context) - n_space :]
            tokens = BYTES.encode(ctx) + BYTES.encode(cont + continuation)
            n = len(BYTES.encode(cont + continuation))
        else:
            tokens = [BYTES.eos_id, *BYTES.encode(continuation)]
            n = len(tokens) - 1
        inputs = tokens[-(BLOCK + 1) :][:-1]
        assert logprob == pytest.approx(direct_logprob(lm.model, inputs, tokens[-n:]), abs=1e-5)
        assert isinstance(is_greedy, bool)
    assert got[1][0] == pytest.approx(lm.loglikelihood(requests(("x = 1 +", " 2")))[0][0], abs=1e-6)


def test_a_whitespace_context_is_read_as_eos(lm):
    # lm-eval moves the context's trailing whitespace onto the continuation: nothing is
    # left of "\n", and EOS is the context, as for "".
    ((logprob, _),) = lm.loglikelihood(requests(("\n", "x")))
    tokens = [BYTES.eos_id, *BYTES.encode("\nx")]
    assert logprob == pytest.approx(direct_logprob(lm.model, tokens[:-1], tokens[1:]), abs=1e-5)


def test_a_dataset_out_of_reach_is_one_clear_error(ckpt, monkeypatch, capsys):
    import lm_eval

    def offline(**kwargs):
        raise ConnectionError(
            "Couldn't reach 'Rowan/hellaswag' on the Hub (LocalEntryNotFoundError)"
        )

    monkeypatch.setattr(lm_eval, "simple_evaluate", offline)
    with pytest.raises(
        HarnessError,
        match=r"^a task's dataset is neither cached nor reachable: "
        r"Couldn't reach 'Rowan/hellaswag' on the Hub .*local task \(--include-path\)",
    ):
        run_harness(ckpt, ["cofr_tiny_ppl"], include_path=str(TASKS))


@pytest.mark.parametrize("preset", ["gpt2-tiny-fa", "llama3-tiny-a", "lstm-tiny"])
def test_batches_padded_on_the_right_score_like_single_sequences(preset):
    # Every mixer is causal, so right padding in a batch changes no scored position.
    torch.manual_seed(0)
    config = ModelConfig.from_preset(preset, vocab_size=320, block_size=BLOCK)
    lm = harness.CofrgenetLM.from_model(build_model(config), BYTES, BLOCK, batch_size=3)
    reqs = [("A", " b"), ("The while statement", " repeats"), ("x" * 50, " y")]
    got = lm.loglikelihood(requests(*reqs))
    for (context, continuation), (logprob, _) in zip(reqs, got, strict=True):
        tokens = BYTES.encode(context + continuation)
        n = len(BYTES.encode(continuation))
        inputs = tokens[-(BLOCK + 1) :][:-1]
        assert logprob == pytest.approx(direct_logprob(lm.model, inputs, tokens[-n:]), abs=1e-5)


def test_a_continuation_longer_than_block_size_is_scored_whole(lm):
    context, continuation = "Answer:", " the quick brown fox jumps over the lazy dog, twice over"
    tokens = BYTES.encode(context) + BYTES.encode(continuation)
    start = len(BYTES.encode(context))
    assert len(tokens) - start > BLOCK
    ((logprob, _),) = lm.loglikelihood(requests((context, continuation)))
    # Disjoint windows of BLOCK targets (as loglikelihood_rolling), each reading BLOCK ids.
    first = direct_logprob(
        lm.model, tokens[start - 1 : start + BLOCK - 1], tokens[start : start + BLOCK]
    )
    end = len(tokens)
    rest = direct_logprob(lm.model, tokens[end - 1 - BLOCK : end - 1], tokens[start + BLOCK :])
    assert logprob == pytest.approx(first + rest, abs=1e-5)


def test_is_greedy_means_every_token_is_the_argmax_of_the_real_vocabulary(lm):
    context = BYTES.encode("The class statement")
    with torch.no_grad():
        logits = lm.model(torch.tensor([context]))[0, -1]
    best = int(logits[: BYTES.vocab_size].argmax())
    other = (best + 1) % BYTES.vocab_size
    (_, greedy), (_, not_greedy) = lm._score_sequences([(context, [best]), (context, [other])])
    assert greedy and not not_greedy


# -- loglikelihood_rolling -------------------------------------------------------------


def test_loglikelihood_rolling_sums_disjoint_windows(lm):
    long_text = "A class definition defines a class object; the inheritance list gives bases. " * 2
    texts = [long_text, "short text"]
    assert len(long_text) > 2 * BLOCK
    got = lm.loglikelihood_rolling(requests(*((t,) for t in texts)))
    for text, total in zip(texts, got, strict=True):
        full = [BYTES.eos_id, *BYTES.encode(text)]  # token i of the text is full[i + 1]
        expected = 0.0
        for s in range(0, len(full) - 1, BLOCK):
            e = min(s + BLOCK, len(full) - 1)  # targets full[s + 1 : e + 1]
            expected += direct_logprob(lm.model, full[max(0, e - BLOCK) : e], full[s + 1 : e + 1])
        assert total == pytest.approx(expected, abs=1e-5)


# -- generate_until --------------------------------------------------------------------


def greedy_reference(model: nn.Module, prompt: str, n: int) -> str:
    """``cofr generate``'s greedy ``sample`` over the tokenizer's ids, decoded."""
    ids = torch.tensor([BYTES.encode(prompt)[-BLOCK:]])
    out = sample(VocabMasked(model, BYTES.vocab_size), ids, n, BLOCK, temperature=0)
    return BYTES.decode(out[0, ids.shape[1] :].tolist())


def test_generate_until_is_greedy_sample(lm, caplog):
    # Two prompts of one length share a batch; the model takes no mask, so others do not.
    prompts = ["The if statement", "A class", "The for statement iterates over " * 2, "A def"]
    # lm_eval's normalize_gen_kwargs adds temperature 0.0 to greedy requests.
    args = {"until": [], "max_gen_toks": 16, "do_sample": False, "temperature": 0.0}
    with caplog.at_level(logging.WARNING):
        got = lm.generate_until(requests(*((p, dict(args)) for p in prompts)))
    assert "ignoring" not in caplog.text
    for prompt, text in zip(prompts, got, strict=True):
        # EOS stops generation too (lm_eval adds its text to the stop strings).
        assert text == greedy_reference(lm.model, prompt, 16).split(EOS_TEXT)[0]


class NextByte(nn.Module):
    """Predicts byte + 1 after each byte; a padded id (300) scores higher still. Records
    the shape of every input."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, int]] = []

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        self.shapes.append(tuple(idx.shape))
        logits = torch.zeros(*idx.shape, 320)
        logits.scatter_(-1, ((idx + 1) % 256)[..., None], 10.0)
        logits[..., 300] = 20.0
        return logits


def test_generate_until_stops_each_row_at_its_stop_string():
    model = NextByte()
    lm = harness.CofrgenetLM.from_model(model, BYTES, 8, batch_size=4)
    args = {"until": ["e", "r"], "max_gen_toks": 10}
    got = lm.generate_until(requests(("ab", dict(args)), ("mn", dict(args))))
    assert got == ["cd", "opq"]
    # One batch of 2 until "ab" has its "e" (3 tokens), then "mn" alone (4 tokens).
    assert [b for b, _ in model.shapes] == [2, 2, 2, 1]
    model.shapes.clear()
    long_prompt = "0123456789"  # longer than the window of 8
    (text,) = lm.generate_until(requests((long_prompt, {"until": ["zz"], "max_gen_toks": 12})))
    assert text == ":;<=>?@ABCDE"
    assert max(t for _, t in model.shapes) == 8 and len(model.shapes) == 12


def test_sampling_is_seeded_and_never_picks_padded_ids(lm):
    args = {"until": [], "max_gen_toks": 12, "do_sample": True, "temperature": 1.5, "top_k": 50}
    first = lm.generate_until(requests(("def f(x):", dict(args))))
    assert first == lm.generate_until(requests(("def f(x):", dict(args))))
    logits = torch.zeros(4, 320)
    logits[:, 300] = 100.0  # a padded id the model likes best
    for kwargs in (
        {"temperature": 0.0},
        {"temperature": 1.0, "top_k": 5},
        {"temperature": 1.0, "top_p": 0.9},
    ):
        assert (sample_next(logits, **kwargs, vocab=257) < 257).all()


def test_top_p_keeps_the_smallest_set_holding_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    picks = {int(sample_next(logits, 1.0, top_p=0.7, vocab=4)) for _ in range(200)}
    assert picks == {0, 1}


@pytest.mark.parametrize("preset", ["gru-tiny", "lstm-tiny"])
def test_a_recurrent_model_generates_with_its_state_and_scores_like_a_transformer(preset):
    torch.manual_seed(0)
    config = ModelConfig.from_preset(preset, vocab_size=BYTES.vocab_size, block_size=BLOCK)
    model = build_model(config).eval()
    lm = harness.CofrgenetLM.from_model(model, BYTES, BLOCK, batch_size=2, max_length=48)
    prompts = ["The while loop", "x"]
    got = lm.generate_until(requests(*((p, {"until": [], "max_gen_toks": 10}) for p in prompts)))
    references = []
    for prompt, text in zip(prompts, got, strict=True):
        ids = torch.tensor([BYTES.encode(prompt)])
        # No padded ids here (vocab 257), so the model's own generate is the reference.
        references.append(sample(model, ids, 10, BLOCK, temperature=0)[0, ids.shape[1] :].tolist())
        assert text == BYTES.decode(references[-1])
    # Rows that stop early leave the batch, hidden state included.
    idx = torch.tensor([BYTES.encode("ab"), BYTES.encode("yz")])
    expected = [
        sample(model, idx[i : i + 1], 10, BLOCK, temperature=0)[0, 2:].tolist() for i in (0, 1)
    ]
    new = decode_until(
        model,
        idx,
        10,
        48,
        choose=lambda logits: logits.argmax(-1, keepdim=True),
        stopped=lambda tokens: tokens == expected[0][:3],
    )
    assert new == [expected[0][:3], expected[1]]
    context, continuation = "x" * 40, " y"  # max_length 48: longer than block_size
    ((logprob, _),) = lm.loglikelihood(requests((context, continuation)))
    tokens = BYTES.encode(context + continuation)
    assert logprob == pytest.approx(direct_logprob(model, tokens[:-1], tokens[-2:]), abs=1e-5)


def test_a_transformer_refuses_max_length_past_block_size(ckpt):
    with pytest.raises(HarnessError, match="block_size"):
        harness.CofrgenetLM(ckpt=str(ckpt), max_length=BLOCK + 1)


# -- registration and end to end -------------------------------------------------------


def gen_task_yaml(folder: Path) -> Path:
    """A generate_until task over a jsonl, loaded with ``dataset_path: json``."""
    data = folder / "gen.jsonl"
    rows = [{"prompt": "1 + 1 =", "target": " 2"}, {"prompt": "def", "target": " f"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {
        "task": "cofr_tiny_gen",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data)}, "cache_dir": str(folder / "cache")},
        "output_type": "generate_until",
        "test_split": "test",
        "doc_to_text": "{{prompt}}",
        "doc_to_target": "{{target}}",
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": 8, "do_sample": False},
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0},
    }
    path = folder / "cofr_tiny_gen.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def test_run_harness_over_local_tasks(ckpt, tmp_path):
    gen = gen_task_yaml(tmp_path)
    results = run_harness(
        ckpt, ["cofr_tiny_mc", "cofr_tiny_ppl", str(gen)], include_path=str(TASKS), batch_size=4
    )
    assert set(results) == {"cofr_tiny_mc", "cofr_tiny_ppl", "cofr_tiny_gen"}
    mc, ppl, gen_metrics = (
        results["cofr_tiny_mc"],
        results["cofr_tiny_ppl"],
        results["cofr_tiny_gen"],
    )
    assert 0.0 <= mc["acc"] <= 1.0 and 0.0 <= mc["acc_norm"] <= 1.0
    assert mc["acc_stderr"] >= 0.0
    # A 2-step model is near uniform over 320 ids: about 8 bits per byte.
    assert 1.0 < ppl["byte_perplexity"] < 320 and 0.0 < ppl["bits_per_byte"] < 9
    assert ppl["word_perplexity"] > ppl["byte_perplexity"]
    assert 0.0 <= gen_metrics["exact_match"] <= 1.0


def test_a_model_with_outputs_not_finite_gets_nan_scores_and_a_warning(ckpt, tmp_path):
    """A NaN weight: lm_eval's argmax over NaN log-likelihoods picked the first choice,
    an accuracy of 0.33 printed, and logged to MLflow, with no word (cofr's own sets
    said "NaN: the model's outputs are not finite")."""
    import torch

    from cofrgenet.eval.cli import score_warnings
    from cofrgenet.training.pretrained import load_checkpoint

    loaded = load_checkpoint(ckpt, device="cpu")
    with torch.no_grad():
        next(loaded.model.parameters()).view(-1)[0] = float("nan")
    gen = str(gen_task_yaml(tmp_path))
    for tasks in (["cofr_tiny_mc"], [gen]):  # scored, and drawn token by token
        results = run_harness(loaded, tasks, include_path=str(TASKS), batch_size=4)
        assert results and all(
            math.isnan(value) for metrics in results.values() for value in metrics.values()
        )
        (said,) = score_warnings(results)
        assert "NaN: the model's outputs are not finite" in said
    # One NaN of a task (a stderr over one document) is the harness's own: not said.
    assert score_warnings({"cofr_tiny_mc": {"acc": 1.0, "acc_stderr": math.nan}}) == []


def test_an_infinite_log_likelihood_is_a_score_and_nan_is_not(lm, monkeypatch):
    """A diverged model's -inf log-likelihood is scored, as cofr's own sets score an inf
    perplexity; only NaN voids the harness's scores."""
    from cofrgenet.eval import scoring

    before = lm.not_finite
    for value, counted in ((-math.inf, 0), (math.nan, 1)):
        monkeypatch.setattr(scoring, "score_continuations", lambda *a, v=value, **k: [(v, False)])
        lm._score_sequences([([1], [2])])
        assert lm.not_finite - before == counted


def test_the_model_is_registered_for_lm_eval_by_name(ckpt):
    from lm_eval import simple_evaluate
    from lm_eval.api.registry import get_model, model_registry
    from lm_eval.tasks import TaskManager

    assert get_model("cofrgenet") is harness.CofrgenetLM
    assert "hf" in model_registry  # lm_eval's own models are still there
    results = simple_evaluate(
        model="cofrgenet",
        model_args=f"ckpt={ckpt},batch_size=2",
        tasks=["cofr_tiny_mc"],
        device="cpu",
        limit=2,
        task_manager=TaskManager(include_path=str(TASKS), include_defaults=False),
        bootstrap_iters=0,
        log_samples=False,
    )
    assert 0.0 <= results["results"]["cofr_tiny_mc"]["acc,none"] <= 1.0
    assert results["config"]["model"] == "cofrgenet"


def test_unknown_tasks_and_a_missing_lm_eval_are_user_errors(ckpt, monkeypatch):
    from lm_eval.tasks import TaskManager

    tasks = TaskManager(include_path=str(TASKS), include_defaults=False)
    assert harness._expand_tasks(tasks, ["cofr_tiny_*"]) == ["cofr_tiny_mc", "cofr_tiny_ppl"]
    with pytest.raises(HarnessError, match=r"did you mean 'cofr_tiny_mc'"):
        harness._expand_tasks(tasks, ["cofr_tiny_mcc"])
    with pytest.raises(HarnessError, match="not a folder"):
        run_harness(ckpt, ["cofr_tiny_mc"], include_path=str(TASKS / "nowhere"))
    # An lm_eval older than 0.4.10 has no model_registry: named, with the version needed.
    monkeypatch.setitem(sys.modules, "lm_eval.api.registry", types.ModuleType("old_registry"))
    with pytest.raises(HarnessNotInstalled, match=r"too old: cofr needs lm_eval >= 0\.4\.10"):
        run_harness(ckpt, ["cofr_tiny_mc"])
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval -> ImportError
    with pytest.raises(HarnessNotInstalled, match="pip install lm_eval"):
        run_harness(ckpt, ["cofr_tiny_mc"])


def test_lm_evals_command_line_says_a_missing_checkpoint_in_one_line(tmp_path, capsys):
    argv = ["--model", "cofrgenet", "--model_args", f"ckpt={tmp_path / 'none.ckpt'}"]
    argv += ["--tasks", "cofr_tiny_mc", "--include_path", str(TASKS), "--device", "cpu"]
    with pytest.raises(SystemExit) as info:
        harness.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"python -m cofrgenet.eval.harness: error: no checkpoint file at {tmp_path}" in err


def test_the_models_tokenizer_errors_name_the_model_argument(ckpt, tmp_path):
    """Under lm_eval the folder is the model argument tokenizer_dir=, not cofr's flag."""
    with pytest.raises(UserError, match=rf"^tokenizer_dir={tmp_path / 'none'}: no such folder"):
        harness.CofrgenetLM(ckpt=str(ckpt), device="cpu", tokenizer_dir=str(tmp_path / "none"))


def test_lm_evals_command_line_device_falls_back_to_one_this_machine_has(ckpt, monkeypatch):
    """lm_eval's command line passes its own default device, cuda:0, whatever the machine
    (a traceback without CUDA), and its --device beside device= in --model_args was a
    "multiple values" traceback: the model arguments win, and CUDA falls back to cpu."""
    cls = harness.CofrgenetLM
    lm = cls.create_from_arg_string(
        f"ckpt={ckpt},device=cpu", {"device": "cuda:0", "batch_size": 5}
    )
    assert (str(lm._device), lm.batch_size) == ("cpu", 5)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    lm = cls.create_from_arg_obj({"ckpt": str(ckpt)}, {"device": "cuda:0", "batch_size": None})
    assert (str(lm._device), lm.batch_size) == ("cpu", 8)


@pytest.mark.slow
def test_lm_evals_command_line_runs_the_model(ckpt, tmp_path):
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cofrgenet.eval.harness",
            "--model",
            "cofrgenet",
            "--model_args",
            f"pretrained={ckpt}",
            "--tasks",
            "cofr_tiny_mc",
            "--include_path",
            str(TASKS),
            "--device",
            "cpu",
            "--batch_size",
            "4",
            "--output_path",
            str(tmp_path / "results"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "cofr_tiny_mc" in proc.stdout and "acc" in proc.stdout
    # pretrained= names lm_eval's results folder after the checkpoint (ckpt=: a random id).
    (folder,) = (tmp_path / "results").iterdir()
    assert folder.name.endswith(f"__{ckpt.name}")


def test_pretrained_is_lm_evals_name_of_the_checkpoint(ckpt):
    """lm_eval's --output_path names its folder after `pretrained=` (with `ckpt=`, a
    random id the same for every checkpoint): the model takes either, not two that differ."""
    lm = harness.CofrgenetLM.create_from_arg_string(f"pretrained={ckpt},device=cpu")
    assert lm.ckpt == str(ckpt)
    with pytest.raises(UserError, match=r"two checkpoints, ckpt=.* and pretrained=other: give one"):
        harness.CofrgenetLM(ckpt=str(ckpt), pretrained="other", device="cpu")
    with pytest.raises(UserError, match=r"needs a checkpoint: --model_args pretrained=PATH"):
        harness.CofrgenetLM(device="cpu")


def test_flatten_results_keeps_numbers_and_names_filters():
    results = {
        "results": {
            "gsm": {
                "alias": "gsm",
                "exact_match,strict-match": 0.5,
                "exact_match_stderr,strict-match": "N/A",
                "acc,none": 0.25,
                "sample_len": 4,
            }
        }
    }
    assert harness.flatten_results(results) == {
        "gsm": {"exact_match/strict-match": 0.5, "acc": 0.25, "sample_len": 4.0}
    }
    # Few-shot scores get names of their own: they never replace the 0-shot ones.
    results["results"]["arc"] = {"acc,none": 0.5}
    results["n-shot"] = {"gsm": 5, "arc": 0}
    assert set(harness.flatten_results(results)) == {"gsm/5shot", "arc"}
    # A perplexity task takes no examples: its "2-shot" numbers are its 0-shot ones.
    results["configs"] = {"gsm": {"output_type": "loglikelihood_rolling"}}
    assert set(harness.flatten_results(results)) == {"gsm", "arc"}


def test_shots_a_task_cannot_give_are_one_error_and_a_perplexity_task_takes_none(ckpt):
    """--num-fewshot 50 on a 3-document task raised random.sample's "Sample larger than
    population" through lm_eval; --num-fewshot 2 on a perplexity task was reported as
    `cofr_tiny_ppl/2shot`, the 0-shot numbers under another name."""
    with pytest.raises(HarnessError, match=r"^--num-fewshot 50: cofr_tiny_mc has fewer"):
        run_harness(ckpt, ["cofr_tiny_mc"], include_path=str(TASKS), num_fewshot=50)
    shot = run_harness(ckpt, ["cofr_tiny_ppl"], include_path=str(TASKS), num_fewshot=2)
    assert shot == run_harness(ckpt, ["cofr_tiny_ppl"], include_path=str(TASKS))
