"""``cofr export hf``: exported folders load in transformers without cofrgenet and match it.

Every exported folder is loaded back by ``AutoModelForCausalLM.from_pretrained(...,
trust_remote_code=True)`` in a separate ``python -I`` process whose import system
refuses ``cofrgenet`` (the package is installed in this venv, so hiding it from sys.path
is not enough). That process compares the logits with ours (max abs difference <= 1e-5,
float32), runs greedy ``generate`` against ``cofrgenet.training.generate.sample`` with
temperature 0, and encodes text with ``AutoTokenizer``. Many exports share one process:
starting Python and importing transformers dominates the cost.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from torch import nn

from cofrgenet.data.tokenizer import ByteTokenizer, train_bpe
from cofrgenet.errors import UserError
from cofrgenet.export import hf as export
from cofrgenet.export.hf import (
    CheckpointNotFound,
    ExportMismatch,
    OutputExists,
    UnsupportedModel,
    export_model,
)
from cofrgenet.models import (
    ARCHITECTURES,
    ATTENTION,
    ModelConfig,
    build_model,
    supported_combinations,
)
from cofrgenet.nn.ladder import OutputRange
from cofrgenet.training.generate import sample
from eval_helpers import tiny_byte_data, trained_checkpoint

TOLERANCE = 1e-5
PROMPT_LEN, NEW_TOKENS = 12, 6  # 12 + 6 > block_size 16: generation crops the context
TINY = {"n_layer": 2, "n_embd": 16, "n_head": 4, "block_size": 16, "vocab_size": 48}
TEXTS = ["Hello, wörld! 🙂\n\tcontinued fractions", "a<b>c  spaces   end", "ünïcödé ∑ 1/(1+x)"]

# Runs in a fresh `python -I` with cofrgenet blocked: loads every case, reports as JSON.
LOADER = textwrap.dedent(
    """
    import json, sys

    class NoCofrgenet:
        def find_spec(self, name, path=None, target=None):
            if name == "cofrgenet" or name.startswith("cofrgenet."):
                raise ImportError(f"{name} is blocked: the export must not need it")
            return None

    sys.meta_path.insert(0, NoCofrgenet())
    sys.path = [p for p in sys.path if not p.rstrip("/").endswith("src")]

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging
    logging.disable_progress_bar()
    logging.set_verbosity_error()

    cases = torch.load(sys.argv[1], weights_only=True)
    results = {}
    for case in cases:
        out = {}
        try:
            if "ids" in case:
                model = AutoModelForCausalLM.from_pretrained(case["dir"], trust_remote_code=True)
                with torch.no_grad():
                    logits = model(input_ids=case["ids"]).logits
                out["max_abs_diff"] = (logits - case["logits"]).abs().max().item()
                out["module"] = type(model).__module__
                generated = model.generate(
                    case["prompt"], max_new_tokens=case["new_tokens"], do_sample=False
                )
                out["generated"] = generated.tolist()
                fresh = AutoModelForCausalLM.from_config(model.config, trust_remote_code=True)
                with torch.no_grad():
                    fresh_logits = fresh(input_ids=case["ids"]).logits
                out["from_config_finite"] = bool(torch.isfinite(fresh_logits).all())
            if "texts" in case:
                tokenizer = AutoTokenizer.from_pretrained(case["dir"], trust_remote_code=True)
                out["encoded"] = [tokenizer(t)["input_ids"] for t in case["texts"]]
                out["decoded"] = [tokenizer.decode(ids) for ids in case["encoded_ours"]]
                out["eos"] = tokenizer.eos_token_id
        except Exception as error:
            out["error"] = f"{type(error).__name__}: {error}"
        results[case["dir"]] = out
    out_file = sys.argv[2]
    with open(out_file, "w") as f:
        json.dump({"results": results, "cofrgenet_loaded": "cofrgenet" in sys.modules}, f)
    """
)


def load_without_cofrgenet(cases: list[dict[str, Any]], work: Path) -> dict[str, Any]:
    """Run LOADER on ``cases`` in an isolated interpreter; {dir: result} per case."""
    work.mkdir(parents=True, exist_ok=True)
    torch.save(cases, work / "cases.pt")
    (work / "loader.py").write_text(LOADER)
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "HF_", "TRANSFORMERS"))
    }
    env.update(
        HF_HOME=str(work / "hf_home"),  # the remote-code module cache of this test only
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-I",
            str(work / "loader.py"),
            str(work / "cases.pt"),
            str(work / "out.json"),
        ],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,  # transformers must never wait for an answer
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((work / "out.json").read_text())
    assert report["cofrgenet_loaded"] is False
    return report["results"]


# Models built in memory ----------------------------------------------------------------


def _configs() -> dict[str, ModelConfig]:
    """Every attention x ffn pair for each transformer arch (positions cycled so each
    appears), the recurrent archs, and the options that change the forward."""
    configs: dict[str, ModelConfig] = {}
    combos = supported_combinations()
    for offset, arch in enumerate(("gpt", "llama")):
        pairs: dict[tuple[str, str], list[str]] = {}
        for c in combos:
            if c.arch == arch:
                pairs.setdefault((c.attention, c.ffn), []).append(c.position)
        for i, ((attention, ffn), positions) in enumerate(sorted(pairs.items())):
            position = positions[(i + offset) % len(positions)]
            configs[f"{arch}-{attention}-{ffn}-{position}"] = ModelConfig(
                arch=arch, attention=attention, ffn=ffn, position=position, **TINY
            )
    for arch in ("rnn", "lstm", "gru"):
        configs[arch] = ModelConfig(arch=arch, **TINY)
    variants: dict[str, dict[str, Any]] = {
        "lstm-untied-hidden": {"arch": "lstm", "rnn_hidden": 24},
        "gru-untied": {"arch": "gru", "tie_embeddings": False, "bias": False},
        "cffn-elementwise": {"ffn": "cffn", "cffn_ladder": "elementwise"},
        "paper-denominators": {
            "attention_pattern": ["cattn_m", "cattn_u"],
            "ffn_pattern": ["cffn"],
            "ladder_denominators": "paper",
            "position": "none",
        },
        "paper-elementwise": {
            "ffn": "cffn",
            "cffn_ladder": "elementwise",
            "ladder_denominators": "paper",
        },
        "no-clip-no-ladder-bias": {
            "attention": "cattn_m",
            "ffn": "cffn",
            "ladder_clip": False,
            "ladder_bias": False,
            "position": "none",
        },
        "floor-depth": {"ffn": "cffn", "ladder_floor": 0.2, "depth": 2, "ladders": 1},
        "patterns": {"attention_pattern": ["softmax", "cattn_u"], "ffn_pattern": ["cffn", "mlp"]},
        "gpt-no-bias-untied": {"bias": False, "tie_embeddings": False, "ffn_hidden": 24},
        "llama-gqa-rope-scaling": {
            "arch": "llama",
            "n_kv_head": 2,
            "norm_eps": 1e-6,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_len": 8,
            },
        },
        "alibi-3-heads-gqa": {"n_head": 6, "n_kv_head": 3, "n_embd": 12, "position": "alibi"},
        "sparse-fixed-explicit": {
            "attention": "sparse_fixed",
            "sparse_stride": 3,
            "sparse_summary": 2,
            "position": "rope",
        },
        "sparse-strided-gqa": {"attention": "sparse_strided", "n_kv_head": 1},
        "synthesizer-sinusoidal": {"attention": "synthesizer_dense", "position": "sinusoidal"},
    }
    for name, fields in variants.items():
        configs[name] = ModelConfig(**{**TINY, **fields})
    return configs


CONFIGS = _configs()


@torch.no_grad()
def _set_clip_ranges(model: nn.Module, ids: torch.Tensor) -> None:
    """Record the ladders' output ranges on ``ids`` (as training does), then narrow them
    so that eval-mode clipping is active on some outputs."""
    ranges = [m for m in model.modules() if isinstance(m, OutputRange)]
    if not ranges:
        return
    model.train()
    model(ids)
    model.eval()
    for r in ranges:
        width = r.high - r.low
        r.low.add_(0.2 * width)
        r.high.sub_(0.2 * width)


def _model_case(name: str, config: ModelConfig, root: Path, seed: int) -> dict[str, Any]:
    """Build, randomise, export (no in-process check) and record our outputs."""
    torch.manual_seed(seed)
    model = build_model(config)
    generator = torch.Generator().manual_seed(seed)
    _set_clip_ranges(model, torch.randint(0, config.vocab_size, (4, 16), generator=generator))
    model.eval()
    ids = torch.randint(0, config.vocab_size, (2, config.block_size), generator=generator)
    prompt = ids[:1, :PROMPT_LEN]
    with torch.no_grad():
        logits = model(ids)
    greedy = sample(model, prompt, NEW_TOKENS, config.block_size, temperature=0)
    out = root / name
    export_model(model, config, out, verify=False)
    return {
        "dir": str(out),
        "ids": ids,
        "logits": logits,
        "prompt": prompt,
        "new_tokens": NEW_TOKENS,
        "greedy": greedy,
    }


def _check_model_results(cases: list[dict[str, Any]], results: dict[str, Any]) -> None:
    failures = []
    for case in cases:
        got = results[case["dir"]]
        name = Path(case["dir"]).name
        if "error" in got:
            failures.append(f"{name}: {got['error']}")
            continue
        if not got["max_abs_diff"] <= TOLERANCE:
            failures.append(f"{name}: logits differ by {got['max_abs_diff']:.3g}")
        if not got["module"].startswith("transformers_modules"):
            failures.append(f"{name}: loaded {got['module']}, not the exported remote code")
        if not got["from_config_finite"]:
            failures.append(f"{name}: a model built from the config alone gives non-finite logits")
        if got["generated"] != case["greedy"].tolist():
            failures.append(f"{name}: greedy {got['generated']} != ours {case['greedy'].tolist()}")
    assert not failures, "\n".join(failures)


def _tokenizer_case(tokenizer: Any, out: Path) -> dict[str, Any]:
    export.export_tokenizer(tokenizer, out, model_max_length=16)
    return {
        "dir": str(out),
        "texts": TEXTS,
        "encoded_ours": [tokenizer.encode(t) for t in TEXTS],
    }


def _check_tokenizer_result(case: dict[str, Any], got: dict[str, Any], eos: int) -> None:
    assert "error" not in got, got.get("error")
    assert got["encoded"] == case["encoded_ours"]  # no BOS/EOS added either
    assert got["decoded"] == case["texts"]
    assert got["eos"] == eos


@pytest.fixture(scope="module")
def bpe_tokenizer():
    return train_bpe(TEXTS * 20, vocab_size=300, min_frequency=1)


def test_the_recorded_tokenizer_kind_gives_its_eos_id(bpe_tokenizer):
    """Without the tokenizer, EOS is known from the kind a checkpoint records."""
    from cofrgenet.data.tokenizer import GPT2_EOS_ID

    assert export.trained_eos_id({"tokenizer": "byte", "vocab_size": 257}) == 256
    assert export.trained_eos_id({"tokenizer": "gpt2"}) == GPT2_EOS_ID
    assert export.trained_eos_id({"tokenizer": "bpe"}) == bpe_tokenizer.eos_id == 0
    assert export.trained_eos_id({}) is None  # a checkpoint that names no tokenizer


def test_every_mixer_exports_and_matches_without_cofrgenet(tmp_path, bpe_tokenizer):
    cases = [
        _model_case(name, config, tmp_path / "exports", seed)
        for seed, (name, config) in enumerate(CONFIGS.items())
    ]
    byte_case = _tokenizer_case(ByteTokenizer(), tmp_path / "tok-byte")
    bpe_case = _tokenizer_case(bpe_tokenizer, tmp_path / "tok-bpe")
    results = load_without_cofrgenet([*cases, byte_case, bpe_case], tmp_path / "load")
    _check_model_results(cases, results)
    _check_tokenizer_result(byte_case, results[byte_case["dir"]], eos=256)
    _check_tokenizer_result(bpe_case, results[bpe_case["dir"]], eos=bpe_tokenizer.eos_id)


@pytest.mark.slow
def test_every_supported_combination_exports(tmp_path):
    combos = supported_combinations()
    cases = [
        _model_case(f"{c.arch}-{c.attention}-{c.ffn}-{c.position}", c.config(**TINY), tmp_path, i)
        for i, c in enumerate(combos)
    ]
    _check_model_results(cases, load_without_cofrgenet(cases, tmp_path / "load"))


@pytest.mark.slow
def test_the_gpt2_tokenizer_exports(tmp_path):
    from cofrgenet.data.tokenizer import TokenizerFilesNotFound, gpt2_tokenizer

    try:
        tokenizer = gpt2_tokenizer()
    except TokenizerFilesNotFound:
        pytest.skip("GPT-2 tokenizer files not installed")
    case = _tokenizer_case(tokenizer, tmp_path / "tok-gpt2")
    results = load_without_cofrgenet([case], tmp_path / "load")
    _check_tokenizer_result(case, results[case["dir"]], eos=50256)


def test_a_bf16_model_is_checked_in_float32_as_written(tmp_path):
    """The export writes float32 weights; the check compared them with the bf16 model's
    logits, failed and asked for a bug report."""
    config = CONFIGS["paper-denominators"]
    torch.manual_seed(0)
    model = build_model(config).eval().to(torch.bfloat16)
    report = export_model(model, config, tmp_path / "out")
    assert report.max_abs_diff is not None and report.max_abs_diff <= TOLERANCE
    assert next(model.parameters()).dtype == torch.bfloat16  # the model is left as it was


@pytest.mark.parametrize(
    "name,clipped",
    [("gpt-softmax-mlp-rope", False), ("no-clip-no-ladder-bias", False), ("patterns", True)],
)
def test_the_readme_names_the_folder_and_clips_only_clipped_ladders(
    tmp_path, monkeypatch, name, clipped
):
    """OUT_DIR `.` wrote from_pretrained(""), and every README said ladder outputs are
    clipped, for models without ladders or with ladder_clip false too. The folder is
    named as a path ("./my-export"): a bare name is a Hub repository's id to transformers
    (one named like a Hub model, "gpt2", would load that model where the hub answers)."""
    folder = tmp_path / "my-export"
    folder.mkdir()
    monkeypatch.chdir(folder)
    config = CONFIGS[name]
    export_model(build_model(config), config, ".", verify=False)
    readme = (folder / "README.md").read_text()
    assert 'from_pretrained("./my-export", trust_remote_code=True)' in readme
    assert ("ladder outputs are clipped" in readme) == clipped


def test_a_model_trained_shorter_than_its_block_generates_from_its_trained_length(tmp_path):
    """A run whose data.block_size is below the model's block: cofr generate reads at most
    the trained length, the export read the whole block (positions that never trained),
    and nothing in the folder said so. The length is in config.json and the README, and
    generate crops there; scoring still takes the whole block."""
    from transformers import AutoModelForCausalLM

    config = ModelConfig(**TINY)  # block 16
    export_model(build_model(config).eval(), config, tmp_path / "short", trained_length=8)
    export_model(build_model(config).eval(), config, tmp_path / "whole", trained_length=16)
    assert json.loads((tmp_path / "short" / "config.json").read_text())["trained_length"] == 8
    assert "trained_length" not in json.loads((tmp_path / "whole" / "config.json").read_text())
    assert "trained at 8 tokens" in (tmp_path / "short" / "README.md").read_text()
    # Recurrent models read any length from a zero state: nothing to crop, nothing said.
    export_model(build_model(CONFIGS["lstm"]), CONFIGS["lstm"], tmp_path / "rnn", trained_length=8)
    assert "trained_length" not in json.loads((tmp_path / "rnn" / "config.json").read_text())
    assert "trained at" not in (tmp_path / "rnn" / "README.md").read_text()
    ids = torch.arange(12).unsqueeze(0)
    for name, read in (("short", 8), ("whole", 12)):
        model = AutoModelForCausalLM.from_pretrained(tmp_path / name, trust_remote_code=True)
        assert model.prepare_inputs_for_generation(ids)["input_ids"].shape[1] == read
        assert model(torch.arange(16).unsqueeze(0)).logits.shape[1] == 16


@pytest.mark.parametrize("tokenizer,eos", [("byte", None), (None, 256), (None, None)])
def test_the_readme_shows_autotokenizer_only_with_a_tokenizer(tmp_path, tokenizer, eos):
    """The README's snippet loaded AutoTokenizer from folders exported without one."""
    config = CONFIGS["gpt-softmax-mlp-rope"].replace(vocab_size=300)
    export_model(
        build_model(config),
        config,
        tmp_path / "out",
        tokenizer=ByteTokenizer() if tokenizer else None,
        eos_id=eos,
        verify=False,
    )
    readme = (tmp_path / "out" / "README.md").read_text()
    snippet = readme.split("```python\n")[1].split("```")[0]
    compile(snippet, "README.md", "exec")
    assert 'AutoModelForCausalLM.from_pretrained("./out", trust_remote_code=True)' in snippet
    assert ("AutoTokenizer" in snippet) == (tokenizer is not None)
    if tokenizer is None:
        assert f"torch.tensor([[{0 if eos is None else eos}]])" in snippet


def test_the_in_process_check_matches_and_writes_the_files(tmp_path):
    config = CONFIGS["paper-denominators"].replace(vocab_size=300)  # room for 257 bytes
    torch.manual_seed(0)
    model = build_model(config)
    ids = torch.randint(0, config.vocab_size, (4, 16))
    unclipped = model.eval()(ids)
    _set_clip_ranges(model, ids)
    assert not torch.allclose(model(ids), unclipped)  # the clip is active
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = export_model(model, config, tmp_path / "out", tokenizer=ByteTokenizer())
    assert report.max_abs_diff is not None and report.max_abs_diff <= TOLERANCE
    assert report.tokenizer == "byte"
    assert set(report.files) == {
        "README.md",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "modeling_cofrgenet.py",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    settings = json.loads((tmp_path / "out" / "config.json").read_text())
    assert settings["cofr"] == config.to_dict()
    assert settings["auto_map"]["AutoModelForCausalLM"] == "modeling_cofrgenet.CofrGeNetForCausalLM"
    assert settings["eos_token_id"] == 256
    # Generation never picks the padded ids 257..299 (no token), as cofr generate; the
    # tokenizer pads batches with end-of-text.
    generation = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert generation["suppress_tokens"] == list(range(257, 300))
    tokenizer_settings = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
    assert tokenizer_settings["pad_token"] == tokenizer_settings["eos_token"]
    # The copied modeling file imports nothing of cofrgenet's.
    source = (tmp_path / "out" / "modeling_cofrgenet.py").read_text()
    assert "import cofrgenet" not in source and "from cofrgenet" not in source


def test_the_check_reads_the_whole_block(tmp_path, monkeypatch):
    """A difference at positions past the first VERIFY_LENGTH (here the learned position
    rows 12..15 of a 16-token block) is caught."""
    config = ModelConfig(arch="gpt", attention="softmax", ffn="cffn", position="learned", **TINY)
    model = build_model(config)
    written = export.export_state_dict

    def late_rows_lost(model):
        state = written(model)
        wpe = next(key for key in state if key.endswith("wpe.weight"))
        state[wpe][12:] = 0.0
        return state

    monkeypatch.setattr(export, "VERIFY_LENGTH", 8)
    monkeypatch.setattr(export, "export_state_dict", late_rows_lost)
    with pytest.raises(export.ExportMismatch, match="logits differ"):
        export_model(model, config, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_standalone_modeling_file_knows_the_exports_architectures():
    from cofrgenet.export import hf_modeling

    assert hf_modeling.TRANSFORMER_ARCHS == export.TRANSFORMER_ARCHS


def test_the_exported_model_takes_right_padding_and_labels(tmp_path):
    from cofrgenet.export.hf_modeling import CofrGeNetForCausalLM

    config = CONFIGS["patterns"]
    torch.manual_seed(0)
    model = build_model(config).eval()
    export_model(model, config, tmp_path / "out", verify=False)
    exported = CofrGeNetForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    ids = torch.randint(0, config.vocab_size, (2, 8))
    with torch.no_grad():
        ours = model(ids)
        right = exported(input_ids=ids, attention_mask=torch.tensor([[1] * 8, [1] * 5 + [0] * 3]))
        loss = exported(input_ids=ids, labels=ids).loss
    assert (right.logits - ours).abs().max() <= TOLERANCE  # right padding changes nothing
    expected = torch.nn.functional.cross_entropy(
        ours[:, :-1].reshape(-1, 48), ids[:, 1:].reshape(-1)
    )
    assert abs(loss.item() - expected.item()) <= 1e-5
    with pytest.raises(ValueError, match="right padding only"):
        exported(input_ids=ids, attention_mask=torch.tensor([[0] * 3 + [1] * 5, [1] * 8]))
    for unsupported in ("output_hidden_states", "output_attentions"):  # not a silent None
        with pytest.raises(ValueError, match=f"{unsupported} is not supported"):
            exported(input_ids=ids, **{unsupported: True})
    # generate appends after a row's padding: refused, prompts of one length work.
    padded = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])
    with pytest.raises(ValueError, match="generate from prompts of one length"):
        exported.generate(input_ids=ids, attention_mask=padded, max_new_tokens=2)
    out = exported.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False
    )
    assert out.shape == (2, 10)
    # A cache asked for is made by transformers and not read: every step sees the context.
    cached = exported.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False,
        use_cache=True,
    )  # fmt: skip
    assert torch.equal(cached, out)


def test_the_exported_model_recomputes_its_blocks_when_asked(tmp_path):
    """transformers' activation (gradient) checkpointing: the blocks keep only their
    input for backward and recompute; the gradients are those without it."""
    from cofrgenet.export.hf_modeling import CofrGeNetForCausalLM

    config = CONFIGS["patterns"]
    torch.manual_seed(0)
    export_model(build_model(config), config, tmp_path / "out", verify=False)
    kept, recomputed = (
        CofrGeNetForCausalLM.from_pretrained(str(tmp_path / "out")).train() for _ in range(2)
    )
    enable = getattr(recomputed, "activation_checkpointing_enable", None)  # transformers 5.x
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the older name's deprecation
        (enable or recomputed.gradient_checkpointing_enable)()
    assert all(block.gradient_checkpointing for block in recomputed.transformer["h"])
    ids = torch.randint(0, config.vocab_size, (2, 8))

    def kept_for_backward(model: torch.nn.Module) -> int:
        """Elements the forward keeps for backward; runs the backward."""
        sizes = []

        def keep(t: torch.Tensor) -> torch.Tensor:
            sizes.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return sum(sizes)

    assert kept_for_backward(recomputed) < kept_for_backward(kept) / 2
    config = CONFIGS["gru-untied"]  # no blocks: transformers' own refusal, not a hint to edit
    export_model(build_model(config), config, tmp_path / "gru", verify=False)
    recurrent = CofrGeNetForCausalLM.from_pretrained(str(tmp_path / "gru"))
    with pytest.raises(ValueError, match="does not support"), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        (getattr(recurrent, "activation_checkpointing_enable", None)
         or recurrent.gradient_checkpointing_enable)()  # fmt: skip
    for (name, a), b in zip(kept.named_parameters(), recomputed.parameters(), strict=True):
        assert (a.grad is None) == (b.grad is None), name
        if a.grad is not None:
            assert torch.equal(a.grad, b.grad), name


@pytest.mark.parametrize("name", ["patterns", "gpt-no-bias-untied", "gru-untied"])
def test_a_resized_vocabulary_saves_and_loads(tmp_path, name):
    """resize_token_embeddings set config.vocab_size but not config.cofr["vocab_size"],
    which builds the model: save_pretrained then from_pretrained failed (size mismatch),
    and a vocab_size given to the config built the old size."""
    from cofrgenet.export.hf_modeling import CofrGeNetConfig, CofrGeNetForCausalLM

    config = CONFIGS[name]
    export_model(build_model(config), config, tmp_path / "out", verify=False)
    exported = CofrGeNetForCausalLM.from_pretrained(str(tmp_path / "out"))
    exported.resize_token_embeddings(64)
    assert exported.config.cofr["vocab_size"] == 64
    exported.save_pretrained(str(tmp_path / "resized"))
    saved = json.loads((tmp_path / "resized" / "config.json").read_text())
    assert saved["vocab_size"] == saved["cofr"]["vocab_size"] == 64
    reloaded = CofrGeNetForCausalLM.from_pretrained(str(tmp_path / "resized")).eval()
    ids = torch.randint(0, 64, (1, 8))
    with torch.no_grad():
        assert reloaded(input_ids=ids).logits.shape == (1, 8, 64)
    # The Hugging Face name wins over cofr's when both are given.
    settings = CofrGeNetConfig.from_pretrained(str(tmp_path / "out"), vocab_size=80)
    assert settings.cofr["vocab_size"] == 80
    fresh = CofrGeNetForCausalLM(settings)
    assert fresh.get_input_embeddings().weight.shape[0] == 80


@pytest.mark.filterwarnings("ignore:Using the model-agnostic default `max_length`")
@pytest.mark.parametrize("name", ["gru-untied", "gpt-softmax-mlp-rope"])
def test_only_transformers_have_a_maximum_length(tmp_path, name):
    """Recurrent exports had max_position_embeddings = block_size: generate warned past it
    ("exceeded the model's predefined maximum length") and capped its default length
    there, though they read any length."""
    from cofrgenet.export.hf_modeling import CofrGeNetForCausalLM

    config = CONFIGS[name]
    export_model(build_model(config), config, tmp_path / "out", verify=False)
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    exported = CofrGeNetForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    ids = torch.randint(0, config.vocab_size, (1, PROMPT_LEN))
    out = exported.generate(input_ids=ids, do_sample=False)  # 20 new tokens by default
    if config.arch in ("gpt", "llama"):
        assert saved["max_position_embeddings"] == config.block_size
        assert out.shape[1] == config.block_size
        return
    assert saved["max_position_embeddings"] is None
    assert exported.config.max_position_embeddings is None
    assert exported.config.cofr["block_size"] == config.block_size
    assert out.shape[1] == PROMPT_LEN + 20


# A real checkpoint through the command -------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("export-ckpt")
    data = tiny_byte_data(root / "data")
    return trained_checkpoint(root, data, preset="gpt2-tiny-fa", steps=2)


def test_cofr_export_hf_writes_a_loadable_model_and_tokenizer(checkpoint, tmp_path, capsys):
    from cofrgenet.cli import main
    from cofrgenet.training.pretrained import load_checkpoint

    out = tmp_path / "hf"
    assert main(["export", "hf", "--ckpt", str(checkpoint), str(out)]) == 0
    printed = capsys.readouterr().out
    assert "tokenizer: byte" in printed and "logits match" in printed
    assert "trust_remote_code=True" in printed  # the hub's loaders ask for it otherwise
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir() if p.is_file()}
    assert modes["model.safetensors"] == modes["config.json"], modes  # not 0600
    loaded = load_checkpoint(checkpoint)
    config = loaded.config
    ids = torch.randint(0, config.vocab_size, (2, config.block_size))
    prompt = torch.tensor([loaded.tokenizer.encode("def main(")])
    with torch.no_grad():
        logits = loaded.model(ids)
    greedy = sample(loaded.model, prompt, 8, config.block_size, temperature=0)
    case = {
        "dir": str(out),
        "ids": ids,
        "logits": logits,
        "prompt": prompt,
        "new_tokens": 8,
        "texts": TEXTS,
        "encoded_ours": [loaded.tokenizer.encode(t) for t in TEXTS],
    }
    got = load_without_cofrgenet([case], tmp_path / "load")[str(out)]
    assert "error" not in got, got.get("error")
    assert got["max_abs_diff"] <= TOLERANCE
    # generate stops at EOS (256): compare up to where it stopped.
    generated, ours = got["generated"][0], greedy[0].tolist()
    assert generated == ours[: len(generated)]
    assert len(generated) == len(ours) or generated[-1] == loaded.tokenizer.eos_id
    _check_tokenizer_result(case, got, eos=256)
    # An earlier export is replaced with --overwrite, never silently.
    assert main(["export", "hf", "--ckpt", str(checkpoint), str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    args = ["export", "hf", "--ckpt", str(checkpoint), str(out), "--overwrite", "--no-tokenizer"]
    assert main(args) == 0
    assert not (out / "tokenizer.json").exists()
    # Without the tokenizer, generation still never picks the ids past its 257 (the
    # checkpoint records its size): hf.generate sampled padded ids, cofr generate none.
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["suppress_tokens"] == list(range(257, config.vocab_size))
    # It still stops at end-of-text (256), as cofr generate: config.json and
    # generation_config.json had no EOS without the tokenizer, so generate never stopped.
    settings = json.loads((out / "config.json").read_text())
    assert settings["eos_token_id"] == settings["bos_token_id"] == 256
    assert generation["eos_token_id"] == generation["pad_token_id"] == 256


@pytest.mark.parametrize("trained_with", ["byte", "bpe"])
def test_a_checkpoint_whose_data_folder_is_gone_exports_without_tokenizer(
    checkpoint, tmp_path, monkeypatch, trained_with
):
    """Bytes need no files: a byte checkpoint exports its tokenizer (and EOS, without
    which HF generate never stops) all the same; another one exports without, saying why."""
    from cofrgenet.training import pretrained as checkpoint_module

    real = checkpoint_module.load_checkpoint

    def moved_data(*args: Any, **kwargs: Any) -> Any:
        loaded = real(*args, **kwargs)
        if kwargs.get("tokenizer_dir") is None:
            loaded.data_dir = str(tmp_path / "moved-away")
            if trained_with == "bpe":
                loaded.trained_with = {"tokenizer": "bpe", "vocab_size": 300}
        return loaded

    monkeypatch.setattr(checkpoint_module, "load_checkpoint", moved_data)
    report = export.export_hf(checkpoint, tmp_path / "out", verify=False)
    assert (tmp_path / "out" / "model.safetensors").is_file()
    generation = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    if trained_with == "byte":
        assert report.tokenizer == "byte" and generation["eos_token_id"] == 256
        assert (tmp_path / "out" / "tokenizer.json").is_file()
        return
    assert report.tokenizer is None and "not on this machine" in report.tokenizer_note
    assert not (tmp_path / "out" / "tokenizer.json").exists()
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "not exported (it was not found)" in readme and "--tokenizer" not in readme
    # EOS comes from the tokenizer kind the checkpoint records: bpe's is id 0.
    assert generation["eos_token_id"] == generation["pad_token_id"] == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["eos_token_id"] == 0
    # A tokenizer asked for explicitly must be found.
    with pytest.raises(UserError):
        export.export_hf(checkpoint, tmp_path / "out2", tokenizer_dir=tmp_path / "no-such-data")


def test_a_data_folder_prepared_again_with_another_tokenizer_is_refused(
    checkpoint, tmp_path, monkeypatch, capsys
):
    """The run's data folder is there but holds another tokenizer: exit 0 with a note
    and no tokenizer written, where cofr generate refuses. Only a missing folder is a note."""
    from cofrgenet.cli import main
    from cofrgenet.training import pretrained as checkpoint_module

    real = checkpoint_module.load_checkpoint

    def trained_on_bpe(*args: Any, **kwargs: Any) -> Any:
        loaded = real(*args, **kwargs)
        loaded.trained_with = {"tokenizer": "bpe", "vocab_size": 300}  # the folder: byte
        return loaded

    monkeypatch.setattr(checkpoint_module, "load_checkpoint", trained_on_bpe)
    out = tmp_path / "out"
    assert main(["export", "hf", "--ckpt", str(checkpoint), str(out), "--no-verify"]) == 2
    err = capsys.readouterr().err
    assert "holds a byte tokenizer of 257 ids" in err and "--tokenizer DIR" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
    # --no-tokenizer exports the model all the same.
    assert (
        main(["export", "hf", "--ckpt", str(checkpoint), str(out), "--no-verify", "--no-tokenizer"])
        == 0
    )
    assert not (out / "tokenizer.json").exists()


@pytest.mark.parametrize("relative", [False, True])
@pytest.mark.parametrize("damage", ["unreadable meta.json", "half-written"])
def test_a_damaged_data_folder_is_refused_not_exported_without_tokenizer(
    checkpoint, tmp_path, monkeypatch, capsys, damage, relative
):
    """The run's data folder is here but damaged: the model was exported without its
    tokenizer, status 0, as if the folder were on another machine."""
    from cofrgenet.cli import main
    from cofrgenet.training import pretrained as checkpoint_module

    data = tmp_path / "data-copy"
    real = checkpoint_module.load_checkpoint

    def damaged_data(*args: Any, **kwargs: Any) -> Any:
        loaded = real(*args, **kwargs)
        shutil.copytree(loaded._tokenizer_folder(), data)
        if damage == "half-written":
            (data / "meta.json").unlink()
        else:
            (data / "meta.json").write_text("{bad")
        loaded.data_dir = "data-copy" if relative else str(data.resolve())
        loaded.trained_with = {"tokenizer": "bpe", "vocab_size": 300}  # no byte shortcut
        return loaded

    monkeypatch.setattr(checkpoint_module, "load_checkpoint", damaged_data)
    monkeypatch.chdir(tmp_path)  # a relative data folder is looked for from here first
    out = tmp_path / "out"
    assert main(["export", "hf", "--ckpt", str(checkpoint), str(out), "--no-verify"]) == 2
    err = capsys.readouterr().err
    assert "meta.json" in err and "Traceback" not in err
    assert not out.exists()


# Refusals ------------------------------------------------------------------------------


def _one_line(error: BaseException) -> str:
    message = str(error)
    assert "\n" not in message and message
    return message


def test_a_missing_checkpoint_is_a_one_line_error(tmp_path, capsys):
    from cofrgenet.cli import main

    with pytest.raises(CheckpointNotFound) as info:
        export.export_hf(tmp_path / "none.ckpt", tmp_path / "out")
    assert "no checkpoint" in _one_line(info.value)
    assert main(["export", "hf", "--ckpt", str(tmp_path / "none.ckpt"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "error: no checkpoint" in err and "Traceback" not in err
    both = ["--tokenizer", str(tmp_path), "--no-tokenizer"]  # one would be dropped
    assert (
        main(["export", "hf", "--ckpt", str(tmp_path / "none.ckpt"), str(tmp_path / "out"), *both])
        == 2
    )
    assert "--no-tokenizer: not allowed with argument --tokenizer" in capsys.readouterr().err


def test_a_torch_file_that_is_no_fit_checkpoint_is_named_so(tmp_path, capsys):
    """A bare state_dict (torch.save(model.state_dict())) was called damaged, "a save
    cut short": it loads fine, it is only not what cofr fit writes."""
    from cofrgenet.cli import main

    bare = tmp_path / "X.pt"
    torch.save(build_model(CONFIGS["rnn"]).state_dict(), bare)
    out = tmp_path / "out"
    assert main(["export", "hf", "--ckpt", str(bare), str(out)]) == 2
    err = capsys.readouterr().err
    assert f"error: {bare} is not a cofr fit checkpoint: it holds a bare state_dict" in err
    assert "cut short" not in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
    listed = tmp_path / "list.pt"
    torch.save([1, 2], listed)
    with pytest.raises(UserError, match="not a cofr fit checkpoint: it holds a list"):
        export.export_hf(listed, out)


def test_a_user_registered_mixer_is_refused(tmp_path):
    @ATTENTION.register("toy_attention_for_export_test")
    def build(config: ModelConfig, layer_idx: int) -> nn.Module:
        return nn.Linear(config.n_embd, config.n_embd)

    try:
        config = ModelConfig(
            **{**TINY, "attention": "toy_attention_for_export_test"}, position="none"
        )
        with pytest.raises(UnsupportedModel) as info:
            export_model(build_model(config), config, tmp_path / "out")
    finally:
        ATTENTION.unregister("toy_attention_for_export_test")
    message = _one_line(info.value)
    assert "toy_attention_for_export_test" in message and "hf_modeling.py" in message
    assert isinstance(info.value, UserError)
    assert not (tmp_path / "out").exists()  # refused before writing anything


def test_a_user_registered_architecture_is_refused(tmp_path):
    class Toy(nn.Module):
        def __init__(self, config: ModelConfig) -> None:
            super().__init__()
            self.head = nn.Embedding(config.vocab_size, config.vocab_size)

    ARCHITECTURES.register("toy_arch_for_export_test", flops=lambda c, t: {}, kind="recurrent")(Toy)
    try:
        config = ModelConfig(arch="toy_arch_for_export_test", vocab_size=8, position="none")
        with pytest.raises(UnsupportedModel) as info:
            export_model(build_model(config), config, tmp_path / "out")
    finally:
        ARCHITECTURES.unregister("toy_arch_for_export_test")
    assert "toy_arch_for_export_test" in _one_line(info.value)


def test_a_replaced_layer_is_refused(tmp_path):
    config = ModelConfig(**TINY)
    model = build_model(config)
    model.transformer.h[1].mlp = nn.Identity()
    with pytest.raises(UnsupportedModel) as info:
        export_model(model, config, tmp_path / "out")
    assert "Identity" in _one_line(info.value) and "layer 1" in str(info.value)


def test_a_mismatch_leaves_nothing_behind(tmp_path):
    config = ModelConfig(**TINY)
    model = build_model(config).eval()
    out = tmp_path / "new" / "parents" / "out"
    with pytest.raises(ExportMismatch) as info:
        export_model(model, config, out, tolerance=-1.0)  # the API takes any tolerance
    assert "differ" in _one_line(info.value) and "nothing was written" in str(info.value)
    # A difference within float32's rounding, below a tolerance set tighter: no fault.
    assert "Please report" not in str(info.value)
    assert "pass --tolerance 1e-05 (the default) or more" in str(info.value)
    # Neither the folder, nor the parents this export made, nor its temporary folder.
    assert list(tmp_path.iterdir()) == []


def test_the_check_allows_rounding_that_grows_with_the_logits(tmp_path):
    """A ladder model's two graphs round apart by ~2e-7 of the largest logit: with logits
    of a few hundred that is above 1e-5, an export the check refused as a fault."""
    config = CONFIGS["gpt-softmax-cffn-sinusoidal"]
    torch.manual_seed(0)
    model = build_model(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.add_(torch.randn_like(parameter) * 0.5)
        model.get_parameter("transformer.ln_f.weight").mul_(30)  # logits up to ~250
    report = export_model(model, config, tmp_path / "out")
    assert report.max_abs_diff > 1e-5  # 4.6e-05 here: a few times the absolute bound
    # Still relative to the logits: a tolerance below their rounding refuses it.
    with pytest.raises(ExportMismatch, match=r"x largest \|logit\| [1-9]\d\d\)"):
        export_model(model, config, tmp_path / "tight", tolerance=1e-8)


def test_a_failed_overwrite_keeps_the_earlier_export(tmp_path):
    config = ModelConfig(**TINY)
    model = build_model(config).eval()
    out = tmp_path / "out"
    export_model(model, config, out, verify=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ExportMismatch):
        export_model(model, config, out, tolerance=-1.0, overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    # An empty folder that was there before stays, empty.
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExportMismatch):
        export_model(model, config, tmp_path / "empty", tolerance=-1.0)
    assert (tmp_path / "empty").is_dir() and not list((tmp_path / "empty").iterdir())
    # A successful overwrite replaces the files in place (an earlier tokenizer included).
    (out / "tokenizer.json").write_text("{}")
    report = export_model(model, config, out, overwrite=True)
    assert "tokenizer.json" not in report.files and not (out / "tokenizer.json").exists()
    assert sorted(p.name for p in out.iterdir()) == report.files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "out"]
    # Interrupted while the new export takes the old one's place: the old one, whole.
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_replace, calls = os.replace, []

    def interrupted(source, target):
        if Path(target).parent == out and Path(source).parent.name.startswith(".out.export"):
            calls.append(target)  # a new file moving in: the old export is aside by now
            if len(calls) == 2:  # one new file in already
                raise KeyboardInterrupt
        real_replace(source, target)

    with (
        mock.patch("cofrgenet.export.hf.os.replace", interrupted),
        pytest.raises(KeyboardInterrupt),
    ):
        export_model(model, config, out, verify=False, overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "out"]
    # Interrupted just after an old file went aside (a signal between the rename and
    # what the rollback once listed, which then left it there and failed on the folder):
    # the old one, whole, all the same.
    calls.clear()

    def interrupted_after(source, target):
        real_replace(source, target)
        if Path(target).parent.name.endswith(".replaced"):
            calls.append(target)
            if len(calls) == 2:
                raise KeyboardInterrupt

    with (
        mock.patch("cofrgenet.export.hf.os.replace", interrupted_after),
        pytest.raises(KeyboardInterrupt),
    ):
        export_model(model, config, out, verify=False, overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "out"]
    # Through a symlink: the folder it names gets the export, the link stays a link.
    link = tmp_path / "link"
    link.symlink_to(out)
    export_model(model, config, link, verify=False, overwrite=True)
    assert link.is_symlink() and (out / "config.json").is_file()


def test_a_sigterm_during_the_export_leaves_no_work_folder(checkpoint, tmp_path, capsys):
    """SLURM's time limit or scancel (SIGTERM) ended the export where it was: its hidden
    work folder beside OUT_DIR stayed, with the whole model's weights, for ever. It goes
    now, as for Ctrl-C, and the export exits with 143."""
    import signal

    from cofrgenet.cli import main
    from cofrgenet.export import hf

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the export")

    def unhandled(signum, frame):  # stands in for the default action: pytest goes on
        raise RuntimeError("SIGTERM reached the handler from before the export")

    before = signal.signal(signal.SIGTERM, unhandled)
    out = tmp_path / "exports" / "out"
    try:
        with (
            mock.patch.object(hf, "verify_export", terminated),
            pytest.raises(SystemExit) as stopped,
        ):
            main(["export", "hf", "--ckpt", str(checkpoint), str(out)])
        assert signal.getsignal(signal.SIGTERM) == unhandled  # put back
    finally:
        signal.signal(signal.SIGTERM, before)
    assert stopped.value.code == 143
    assert "stopped by SIGTERM" in capsys.readouterr().err
    assert not (tmp_path / "exports").exists()  # nor the work folder, nor its parent


def test_a_negative_tolerance_and_bad_paths_are_one_line(checkpoint, tmp_path, capsys):
    from test_cli_errors import one_line_error

    out = tmp_path / "out"
    argv = ["export", "hf", "--ckpt", str(checkpoint), str(out)]
    line = one_line_error(capsys, [*argv, "--tolerance", "-1"])
    assert line.startswith("cofr export hf: error: argument --tolerance: must be >= 0")
    line = one_line_error(capsys, ["export", "hf", str(out), str(checkpoint)])
    assert line.endswith(f"the other way round? cofr export hf --ckpt {checkpoint} {out}")
    line = one_line_error(capsys, ["export", "hf", "--ckpt", str(checkpoint), ""])
    assert line.endswith("OUT_DIR is empty: name the folder to write the export into")
    line = one_line_error(capsys, [*argv, "--no-verify", "--tolerance", "1e-3"])  # was ignored
    assert line.endswith("--tolerance sets the check that --no-verify skips: drop one of them")
    missing = tmp_path / "nonexist"
    line = one_line_error(capsys, [*argv, "--tokenizer", str(missing)])
    assert line.startswith(f"cofr export hf: error: --tokenizer {missing}: no such folder")
    assert "training data folder" not in line
    run_dir = checkpoint.parents[1]
    line = one_line_error(capsys, ["export", "hf", "--ckpt", str(run_dir), str(out)])
    assert f"did you mean {checkpoint}?" in line
    assert not out.exists()


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path):
    config = CONFIGS["gru"]  # vocabulary 48 < the byte tokenizer's 257
    with pytest.raises(export.TokenizerMismatch) as info:
        export_model(build_model(config), config, tmp_path / "out", tokenizer=ByteTokenizer())
    assert "257 tokens" in _one_line(info.value)
    assert not (tmp_path / "out").exists()


def test_overwrite_only_replaces_an_export(tmp_path):
    config = CONFIGS["rnn"]
    model = build_model(config).eval()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(OutputExists) as info:
        export_model(model, config, tmp_path / "out", verify=False)
    assert "--overwrite" in _one_line(info.value)
    with pytest.raises(OutputExists) as info:
        export_model(model, config, tmp_path / "out", verify=False, overwrite=True)
    assert "notes.txt" in _one_line(info.value)
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"
    # A user's own files that bear an export's names are no earlier export either.
    (tmp_path / "out" / "notes.txt").unlink()
    (tmp_path / "out" / "README.md").write_text("mine")
    with pytest.raises(OutputExists, match=r"holds none \(no modeling_cofrgenet\.py\)") as info:
        export_model(model, config, tmp_path / "out", verify=False, overwrite=True)
    assert (tmp_path / "out" / "README.md").read_text() == "mine"


def test_overwrite_keeps_a_model_saved_or_changed_by_transformers(tmp_path):
    """save_pretrained writes an export's names, modeling file included: a model
    fine-tuned from an export and saved by transformers was replaced by --overwrite."""
    from transformers import AutoModelForCausalLM

    config = ModelConfig(**TINY)
    model = build_model(config).eval()
    export_model(model, config, tmp_path / "export", verify=False)
    tuned = AutoModelForCausalLM.from_pretrained(str(tmp_path / "export"), trust_remote_code=True)
    with torch.no_grad():
        next(tuned.parameters()).add_(0.01)
    tuned.save_pretrained(str(tmp_path / "tuned"))  # its own folder: no export README
    saved = {p.name: p.read_bytes() for p in (tmp_path / "tuned").iterdir()}
    assert "modeling_cofrgenet.py" in saved and "README.md" not in saved
    with pytest.raises(OutputExists, match=r"no export's README\.md \(a model saved by"):
        export_model(model, config, tmp_path / "tuned", verify=False, overwrite=True)
    assert {p.name: p.read_bytes() for p in (tmp_path / "tuned").iterdir()} == saved
    # Saved over the export itself: the README stays, the weights are not its own.
    tuned.save_pretrained(str(tmp_path / "export"))
    saved = {p.name: p.read_bytes() for p in (tmp_path / "export").iterdir()}
    with pytest.raises(OutputExists, match=r"model\.safetensors is not the one the export wrote"):
        export_model(model, config, tmp_path / "export", verify=False, overwrite=True)
    assert {p.name: p.read_bytes() for p in (tmp_path / "export").iterdir()} == saved


def test_weights_that_are_not_finite_are_not_exported(tmp_path):
    """A diverged checkpoint's NaN weights: 'differ by nan ... pass --tolerance 1e-05'
    with the check, a model computing NaN without it."""
    config = ModelConfig(**TINY)
    model = build_model(config).eval()
    with torch.no_grad():
        model.get_parameter("transformer.ln_f.weight")[0] = float("nan")
    for verify in (True, False):
        with pytest.raises(export.ExportError, match=r"^1 of the model's weight tensors hold "
                           r"NaN or Inf \(transformer\.ln_f\.weight, \.\.\.\)"):  # fmt: skip
            export_model(model, config, tmp_path / "out", verify=verify)
        assert not (tmp_path / "out").exists()


def test_an_out_dir_that_cannot_be_made_is_one_line(tmp_path):
    config = CONFIGS["rnn"]
    (tmp_path / "a-file").write_text("mine")
    with pytest.raises(export.ExportError, match=r"cannot write the export to .*a-file"):
        export_model(build_model(config).eval(), config, tmp_path / "a-file" / "out", verify=False)
    assert (tmp_path / "a-file").read_text() == "mine"


def test_the_exported_model_trains_unclipped_as_cofrgenet_does(tmp_path):
    """In train() mode the export clipped ladder outputs to the recorded range while
    cofrgenet's training does not: fine-tuned with transformers, outputs past the range
    got no gradient. It computes cofrgenet's training forward now, and clips in eval."""
    from cofrgenet.export.hf_modeling import CofrGeNetForCausalLM
    from cofrgenet.nn.ladder import recording_paused

    config = CONFIGS["paper-denominators"]
    torch.manual_seed(0)
    model = build_model(config)
    ids = torch.randint(0, config.vocab_size, (2, 8))
    _set_clip_ranges(model, ids)  # narrowed: the eval clip is active
    export_model(model, config, tmp_path / "out", verify=False)
    exported = CofrGeNetForCausalLM.from_pretrained(str(tmp_path / "out"))
    with torch.no_grad():
        model.train()
        with recording_paused(model):
            trained = model(ids)
        model.eval()
        scored = model(ids)
        assert not torch.allclose(trained, scored, atol=1e-5)  # the clip changes outputs
        torch.testing.assert_close(exported.eval()(ids).logits, scored, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(exported.train()(ids).logits, trained, atol=1e-5, rtol=1e-5)


def test_a_config_of_another_model_is_named_so(tmp_path):
    """A CoFrGeNet-F model exported with GPT-2's config read "it is a Cffn, not the built-in
    MLP (a custom builder replaced it)"."""
    model = build_model(ModelConfig.from_preset("gpt2-tiny-f", block_size=32))
    with pytest.raises(UnsupportedModel, match=r"^the config does not describe this model: "
                       r"its ffn of layer 0 is 'mlp', the model's is a Cffn \(the built-in "
                       r"'cffn'\); pass the config the model was built from$"):  # fmt: skip
        export_model(model, ModelConfig.from_preset("gpt2-tiny", block_size=32), tmp_path / "o")
    assert not (tmp_path / "o").exists()
