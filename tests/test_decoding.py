"""Incremental decoding: every attention mixer's ``decode`` equals its ``forward``, and a
model's cached generation equals recomputing the whole context for every token."""

from __future__ import annotations

import pytest
import torch

from cofrgenet.models import ModelConfig, build_model
from cofrgenet.models.generation import decode_until
from cofrgenet.nn.decoding import sample_next

#: (preset, overrides): every attention mixer, every position encoding that reaches one.
VARIANTS = {
    "gpt2-softmax-learned": ("gpt2-tiny", {}),
    "gpt2-softmax-sinusoidal": ("gpt2-tiny", {"position": "sinusoidal"}),
    "gpt2-softmax-alibi": ("gpt2-tiny", {"position": "alibi"}),
    "llama-rope-gqa": ("llama3-tiny", {"n_head": 4, "n_kv_head": 2}),
    "sparse-strided": ("gpt2-tiny", {"attention": "sparse_strided", "sparse_stride": 3}),
    "sparse-fixed-rope": (
        "llama3-tiny",
        {"attention": "sparse_fixed", "sparse_stride": 4, "sparse_summary": 2},
    ),
    "synthesizer": ("gpt2-tiny", {"attention": "synthesizer_dense"}),
    "cattn_m": ("gpt2-tiny-fa", {}),
    "cattn_u": ("gpt2-tiny-f", {"attention": "cattn_u"}),
    "cattn_m-paper": ("gpt2-tiny-a", {"ladder_denominators": "paper"}),
}
BLOCK = 12


def model_of(name: str) -> torch.nn.Module:
    preset, overrides = VARIANTS[name]
    config = ModelConfig.from_preset(preset, vocab_size=50, block_size=BLOCK, **overrides)
    torch.manual_seed(0)
    model = build_model(config).double()
    model.train()
    with torch.no_grad():  # fill the ladders' output ranges: eval mode then clips
        model(torch.randint(0, 50, (4, BLOCK)))
    return model.eval()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_decoding_in_chunks_equals_the_full_forward(name):
    model = model_of(name)
    assert model.can_decode
    idx = torch.randint(0, 50, (3, BLOCK), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache()
        pieces = [model(idx[:, a:b], cache) for a, b in ((0, 5), (5, 6), (6, 7), (7, 10), (10, 12))]
    assert cache.length == BLOCK
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_decoding_in_chunks_equals_the_full_forward_in_float32(name):
    """The precision models run in: each decode path within float32 rounding of forward
    (the float64 test above holds the arithmetic; this one, its float32 kernels)."""
    model = model_of(name).float()
    idx = torch.randint(0, 50, (3, BLOCK), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache()
        pieces = [model(idx[:, a:b], cache) for a, b in ((0, 5), (5, 6), (6, 7), (7, 12))]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-4, atol=1e-5)


def test_a_cache_past_the_block_is_refused():
    model = model_of("gpt2-softmax-learned")
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.zeros(1, BLOCK, dtype=torch.long), cache)
        with pytest.raises(ValueError, match="exceeds block_size"):
            model(torch.zeros(1, 1, dtype=torch.long), cache)


def recompute_every_step(model, idx, new, temperature, top_k, generator, context=BLOCK):
    """The reference: the whole (cropped) context at every step."""
    for _ in range(new):
        logits = model(idx[:, -context:])[:, -1, :]
        idx = torch.cat([idx, sample_next(logits, temperature, top_k, generator)], dim=1)
    return idx


@pytest.mark.parametrize(
    "name", ["gpt2-softmax-learned", "llama-rope-gqa", "cattn_u", "cattn_m", "synthesizer"]
)
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_cached_generation_equals_recomputation_past_the_block(name, temperature):
    model = model_of(name)
    prompt = torch.randint(0, 50, (2, 4), generator=torch.Generator().manual_seed(2))
    new = 2 * BLOCK  # runs past the block: the window then slides
    with torch.no_grad():
        cached = model.generate(prompt, new, temperature, 10, torch.Generator().manual_seed(3))
        reference = recompute_every_step(
            model, prompt, new, temperature, 10, torch.Generator().manual_seed(3)
        )
    assert torch.equal(cached, reference)


@pytest.mark.parametrize("name", ["gpt2-softmax-learned", "cattn_m"])
def test_generation_reads_at_most_the_context_it_is_given(name):
    """A model trained on sequences shorter than its block generates from windows of the
    trained length (``cofr generate`` passes it): positions past it never trained."""
    model = model_of(name)
    prompt = torch.randint(0, 50, (2, 3), generator=torch.Generator().manual_seed(2))
    context = BLOCK // 2
    with torch.no_grad():
        cropped = model.generate(
            prompt, BLOCK, 0.9, 10, torch.Generator().manual_seed(3), context=context
        )
        reference = recompute_every_step(
            model, prompt, BLOCK, 0.9, 10, torch.Generator().manual_seed(3), context
        )
        whole_block = model.generate(prompt, BLOCK, 0.9, 10, torch.Generator().manual_seed(3))
    assert torch.equal(cropped, reference)
    assert not torch.equal(cropped, whole_block)  # the window matters: the test has teeth
    with pytest.raises(ValueError, match="context must be in"):
        model.generate(prompt, 2, context=BLOCK + 1)


def test_training_mode_generation_recomputes():
    model = model_of("gpt2-softmax-learned").train()
    out = model.generate(torch.zeros(1, 2, dtype=torch.long), 3, temperature=0)
    assert out.shape == (1, 5)


@pytest.mark.parametrize("name", ["gpt2-softmax-learned", "cattn_u"])
def test_generated_ids_and_cached_helpers_can_train_afterwards(name):
    """Generation runs in inference mode; neither its output nor anything a layer caches
    during it (CAttnU's triangle indices, built first here) may be an inference tensor
    that a later training step would refuse to save for backward."""
    from cofrgenet.nn.cattn import _cached_upper_triangle

    model = model_of(name)
    _cached_upper_triangle.cache_clear()
    out = model.generate(torch.zeros(2, 3, dtype=torch.long), 4, temperature=0.8)
    assert not out.is_inference() and out.shape == (2, 7)
    model.train()
    model(out).float().square().mean().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("preset", ["gpt2-tiny", "gpt2-tiny-f", "lstm-tiny"])
def test_top_p_reaches_every_generate(preset):
    """A nucleus so small that it holds only the likeliest id samples greedily, through
    each model's own generate and through training.generate.sample's fallback loop; a
    nucleus of 1 cuts nothing."""
    from cofrgenet.training.generate import sample

    config = ModelConfig.from_preset(preset, vocab_size=50, block_size=BLOCK)
    torch.manual_seed(0)
    model = build_model(config).eval()
    prompt = torch.randint(0, 50, (2, 3), generator=torch.Generator().manual_seed(4))
    greedy = model.generate(prompt, 6, temperature=0.0)
    nucleus = model.generate(prompt, 6, 5.0, None, torch.Generator().manual_seed(5), top_p=1e-6)
    assert torch.equal(nucleus, greedy)
    plain = torch.nn.Sequential(*[model])  # no generate of its own: the recompute loop
    looped = sample(plain, prompt, 6, BLOCK, 5.0, None, torch.Generator().manual_seed(5), 1e-6)
    assert torch.equal(looped, greedy)
    hot = model.generate(prompt, 6, 5.0, None, torch.Generator().manual_seed(5), top_p=1.0)
    assert not torch.equal(hot, greedy)  # temperature 5 over 50 ids: the check has teeth


@pytest.mark.parametrize("preset", ["gpt2-tiny", "gpt2-tiny-f", "lstm-tiny"])
def test_every_generate_keeps_to_the_tokenizers_ids_and_stops_at_eos(preset):
    """A padded vocabulary (50 ids, the tokenizer's 20): no id above 20 is sampled, hot
    as the sampling is; and every row stops once it has sampled the stop id, through each
    model's own generate and training.generate.sample's fallback loop."""
    from cofrgenet.training.generate import sample

    config = ModelConfig.from_preset(preset, vocab_size=50, block_size=BLOCK)
    torch.manual_seed(0)
    model = build_model(config).eval()
    prompt = torch.randint(0, 20, (3, 2), generator=torch.Generator().manual_seed(1))
    plain = torch.nn.Sequential(*[model])  # no generate of its own: the recompute loop
    for generate in (model.generate, lambda *a, **k: sample(plain, a[0], a[1], BLOCK, **k)):
        hot = generate(prompt, 40, temperature=50.0, generator=torch.Generator().manual_seed(2))
        assert int(hot[:, 2:].max()) >= 20  # without the limit, padded ids come up
        kept = generate(
            prompt, 40, temperature=50.0, generator=torch.Generator().manual_seed(2), vocab=20
        )
        assert int(kept[:, 2:].max()) < 20
        stop = int(kept[0, 2])  # the first row's first sampled id: it stops at once
        ended = generate(
            prompt, 40, temperature=50.0, generator=torch.Generator().manual_seed(2), vocab=20,
            stop_id=stop,
        )  # fmt: skip
        assert ended.shape[1] < kept.shape[1] and torch.equal(ended, kept[:, : ended.shape[1]])
        assert all(stop in row[2:].tolist() for row in ended)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"top_p": 0.0}, "top_p must be in"),
        ({"top_p": 1.5}, "top_p must be in"),
        ({"top_k": 0}, "top_k must be >= 1"),
    ],
)
def test_bad_sampling_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sample_next(torch.zeros(1, 5), 1.0, **kwargs)


def test_a_tiny_temperature_samples_the_arg_max():
    """logits / 1e-40 overflowed to inf and softmax gave NaN: a traceback from
    `cofr generate --temperature 1e-40`."""
    logits = torch.tensor([[0.5, 3.0, -1.0, 2.9], [-2.0, -7.0, -1.5, float("-inf")]])
    # 1e-50 and below round to 0 in float32: 0 / 0 made the max NaN.
    for temperature in (1e-30, 1e-40, 1e-50, 5e-324):
        assert sample_next(logits, temperature).flatten().tolist() == [1, 2]
    tied = torch.tensor([[1.0, 4.0, 4.0, -3.0]])  # the limit samples among equal maxima
    generator = torch.Generator().manual_seed(0)
    drawn = {sample_next(tied, 1e-60, generator=generator).item() for _ in range(40)}
    assert drawn == {1, 2}


# -- decode_until: each row to its own stop (the evaluation harness's generate_until) --

HARNESS_BLOCK, HARNESS_VOCAB = 32, 257  # bytes and EOS


def full_recompute(model, idx, steps, max_length, stop_after=None):
    """Greedy ids after each row of idx, re-reading the last max_length ids every step."""
    out = []
    for row in idx:
        ids, new = row[None], []
        for _ in range(steps):
            with torch.no_grad():
                token = model(ids[:, -max_length:])[0, -1].argmax()
            new.append(int(token))
            ids = torch.cat([ids, token.view(1, 1)], dim=1)
            if stop_after is not None and new == stop_after:
                break
        out.append(new)
    return out


@pytest.mark.parametrize("attention", ["softmax", "cattn_u", "cattn_m"])
def test_a_transformer_decodes_through_its_cache_like_a_full_recompute(attention, monkeypatch):
    torch.manual_seed(0)
    config = ModelConfig.from_preset(
        "gpt2-tiny-f", vocab_size=HARNESS_VOCAB, block_size=HARNESS_BLOCK, attention=attention
    )
    model = build_model(config).eval()
    calls, grad_modes = [], set()
    forward = model.forward

    def counted_forward(idx, cache=None):
        calls.append(idx.shape[1])
        grad_modes.add(torch.is_grad_enabled())
        return forward(idx, cache)

    monkeypatch.setattr(model, "forward", counted_forward)
    idx = torch.tensor([list(b"abcd"), list(b"wxyz"), list(b"0123")])
    expected = full_recompute(model, idx, 12, HARNESS_BLOCK)
    stop_row0 = expected[0][:3]
    expected[0] = stop_row0  # row 0 stops early and leaves the batch with its cache rows
    calls.clear()
    new = decode_until(
        model,
        idx,
        12,
        HARNESS_BLOCK,
        choose=lambda logits: logits.argmax(-1, keepdim=True),
        stopped=lambda tokens: tokens == stop_row0,
    )
    assert new == expected
    assert calls == [4] + [1] * 11  # the prompt once, then one token a step
    # Called with autograd on, it still keeps no graph: cache writes would chain into one.
    assert grad_modes == {False}
    # Past max_length the window slides, and the cache gives way to a recompute.
    long = torch.tensor([list(b"x" * (HARNESS_BLOCK - 2))])
    expected = full_recompute(model, long, 6, HARNESS_BLOCK)
    calls.clear()
    new = decode_until(
        model, long, 6, HARNESS_BLOCK, lambda lg: lg.argmax(-1, keepdim=True), lambda t: False
    )
    assert new == expected
    assert calls == [HARNESS_BLOCK - 2, 1, 1] + [HARNESS_BLOCK] * 3


def test_sampling_checks_its_prompt_and_leaves_the_ladder_ranges_alone():
    """A (T,) or empty prompt failed with IndexErrors, vocab=0 in amax; generate() on a
    model left in train mode recorded the sampled contexts into its clip ranges."""
    from cofrgenet.models import ModelConfig, build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig.from_preset("gpt2-tiny-f", block_size=8, vocab_size=32))
    model(torch.randint(0, 32, (2, 8)))  # train mode: one batch recorded
    ranges = [b.clone() for name, b in model.named_buffers() if "output_range" in name]
    for bad in (torch.tensor([1, 2, 3]), torch.zeros(2, 0, dtype=torch.long)):
        with pytest.raises(ValueError, match=r"the prompt must be \(batch, tokens\) ids"):
            model.generate(bad, 2)
    with pytest.raises(ValueError, match="vocab must be >= 1"):
        model.generate(torch.tensor([[1, 2]]), 2, vocab=0)
    assert model.training
    model.generate(torch.randint(0, 32, (3, 4)), 6, temperature=1.5)
    after = [b for name, b in model.named_buffers() if "output_range" in name]
    assert all(torch.equal(a, b) for a, b in zip(ranges, after, strict=True))
