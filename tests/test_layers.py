"""CoFrGeNet layers: parameter formulas, causality, initialisation, health, impl agreement."""

from __future__ import annotations

import copy

import pytest
import torch

from cofrgenet.nn import CAttnM, CAttnU, Cffn, LadderWeights
from cofrgenet.ops import triton_available


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_cffn_paper_count():
    assert n_params(Cffn(768, 3, 5, ladder="scalar", bias=False)) == 1_193_472


@pytest.mark.parametrize("ladder", ["scalar", "elementwise"])
@pytest.mark.parametrize(
    "bias,ladder_bias", [(False, None), (True, None), (True, False), (False, True)]
)
@pytest.mark.parametrize("dim,ladders,depth", [(16, 1, 1), (24, 3, 5), (13, 7, 3)])
def test_cffn_formula(ladder, bias, ladder_bias, dim, ladders, depth):
    layer = Cffn(dim, ladders, depth, ladder=ladder, bias=bias, ladder_bias=ladder_bias)
    formula = Cffn.num_parameters_formula(dim, ladders, depth, ladder, bias, ladder_bias)
    assert n_params(layer) == formula


@pytest.mark.parametrize("bias,ladder_bias", [(False, None), (True, None), (True, False)])
@pytest.mark.parametrize("max_len,depth", [(8, 1), (17, 5)])
def test_cattn_u_formula(bias, ladder_bias, max_len, depth):
    layer = CAttnU(12, max_len, depth, bias=bias, ladder_bias=ladder_bias)
    assert n_params(layer) == CAttnU.num_parameters_formula(max_len, depth, bias, ladder_bias)
    # The paper's count, depth d' = d + 1 counting the linear term, without ladder biases.
    if not (ladder_bias if ladder_bias is not None else bias):
        assert n_params(layer) == max_len * (2 * (depth + 1) + max_len + 1)


@pytest.mark.parametrize("max_len", [1, 2, 9])
def test_cattn_u_mixing_columns_are_the_matrices_columns(max_len):
    """Decoding reads columns of the packed triangles directly: the same entries, the
    same zeros below the diagonal, and the same gradient."""
    layer = CAttnU(4, max_len, 2).double()
    with torch.no_grad():
        layer.mixing.copy_(torch.randn_like(layer.mixing))
    for start in range(max_len):
        for length in range(1, max_len - start + 1):
            columns = layer.mixing_columns(start, length)
            full = layer.mixing_matrices(start + length)[:, :, start:]
            assert torch.equal(columns, full), (start, length)
    weights = torch.randn(2, max_len, 1, dtype=torch.double)
    (grad_columns,) = torch.autograd.grad(
        (layer.mixing_columns(0, max_len) * weights).sum(), layer.mixing
    )
    (grad_full,) = torch.autograd.grad(
        (layer.mixing_matrices(max_len) * weights).sum(), layer.mixing
    )
    assert torch.equal(grad_columns, grad_full)


@pytest.mark.parametrize("bias,ladder_bias", [(False, None), (True, None), (False, True)])
@pytest.mark.parametrize("dim,max_len,ladders,depth", [(16, 8, 1, 1), (20, 11, 3, 5)])
def test_cattn_m_formula(bias, ladder_bias, dim, max_len, ladders, depth):
    layer = CAttnM(dim, max_len, ladders, depth, bias=bias, ladder_bias=ladder_bias)
    formula = CAttnM.num_parameters_formula(dim, max_len, ladders, depth, bias, ladder_bias)
    assert n_params(layer) == formula
    if depth == 1 and not bias and not ladder_bias:  # the paper's L (p + l) + p^2
        assert n_params(layer) == ladders * (dim + max_len) + dim * dim


#: The op implementations the layers are compared through; triton where it is installed.
IMPLS = ("literal", "continuant", "compiled") + (("triton",) if triton_available() else ())

LAYERS = {
    "cffn-scalar": lambda **kw: Cffn(16, 3, 4, ladder="scalar", **kw),
    "cffn-elementwise": lambda **kw: Cffn(16, 2, 3, ladder="elementwise", **kw),
    "cattn_u": lambda **kw: CAttnU(16, 12, 3, **kw),
    "cattn_m": lambda **kw: CAttnM(16, 12, 3, 4, **kw),
}


@pytest.mark.parametrize("name", LAYERS)
@pytest.mark.parametrize("length", [12, 7])
def test_causal_by_perturbation(name, length):
    torch.manual_seed(0)
    layer = LAYERS[name]().double()
    x = torch.randn(2, length, 16, dtype=torch.float64)
    out = layer(x)
    assert out.shape == x.shape
    for t in range(length - 1):
        perturbed = x.clone()
        perturbed[:, t + 1 :] += torch.randn_like(perturbed[:, t + 1 :])
        changed = layer(perturbed)
        assert torch.equal(changed[:, : t + 1], out[:, : t + 1]), f"position {t} saw the future"
        assert not torch.allclose(changed[:, t + 1 :], out[:, t + 1 :])  # the test can fail


#: Bound on a bf16-autocast layer's error, relative to the largest entry of each float64
#: output or gradient: bf16 keeps 8 bits (eps 2^-8 = 0.4%); the layers, their parameters
#: moved off init, come within 0.8% of it on CPU.
BF16_REL = 2e-2


@pytest.mark.parametrize("name", LAYERS)
def test_bf16_autocast_follows_the_float64_layer(name):
    """Under CPU bf16 autocast (what GPU recipes train in) every layer runs forward and
    backward; its bf16 output and the gradients of the input and of every parameter are
    within BF16_REL (of the largest entry) of the float64 layer's, element by element.

    Parameters are moved off their init first: at init the outputs are tiny (max 0.016
    for cattn_m, 0.053 for cattn_u) and Cffn's ladder term small, so that a layer that
    dropped its ladders under autocast (or CAttnM's output) passed a fixed 0.05 bound.
    """
    torch.manual_seed(0)
    layer = LAYERS[name]()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    reference = copy.deepcopy(layer).double()
    x = torch.randn(2, 9, 16, requires_grad=True)
    x64 = x.detach().double().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = layer(x)
    want = reference(x64)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), want, rtol=0, atol=BF16_REL * want.abs().max().item())
    cotangent = torch.randn(got.shape)
    names, params = zip(*layer.named_parameters(), strict=True)
    grads = torch.autograd.grad(got.float(), [x, *params], cotangent)
    expected = torch.autograd.grad(want, [x64, *reference.parameters()], cotangent.double())
    for pname, g, e in zip(["input", *names], grads, expected, strict=True):
        bound = BF16_REL * e.abs().max().item()
        torch.testing.assert_close(
            g.double(), e, rtol=0, atol=bound, msg=lambda m, n=pname: f"{n}: {m}"
        )


@pytest.mark.parametrize("denominators", ["positive", "paper"])
@pytest.mark.parametrize("name", LAYERS)
def test_impls_agree_forward_and_backward(name, denominators, device):
    """The layer gives the same values and gradients through each op implementation.

    Inputs are kept small so that no ladder is near a pole of any level: there the literal
    form, which clamps every level, legitimately differs from the continuant form. triton
    runs on the device fixture's device (Triton's interpreter without a GPU), the others
    on CPU.
    """
    torch.manual_seed(0)
    base = LAYERS[name](denominators=denominators).double()
    x = 0.3 * torch.randn(2, 9, 16, dtype=torch.float64)
    results = {}
    for impl in IMPLS:
        on = device if impl == "triton" else torch.device("cpu")
        layer = LAYERS[name](denominators=denominators).double().to(on)
        layer.load_state_dict(base.state_dict())
        layer.impl = impl
        xi = x.to(on, copy=True).requires_grad_()
        layer(xi).square().sum().backward()
        grads = [p.grad.cpu() for p in layer.parameters()]
        results[impl] = (layer(x.to(on)).detach().cpu(), xi.grad.cpu(), grads)
    ref_out, ref_gx, ref_grads = results["literal"]
    for impl in IMPLS[1:]:
        out, gx, grads = results[impl]
        torch.testing.assert_close(out, ref_out, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(gx, ref_gx, rtol=1e-9, atol=1e-12)
        for g, ref in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(g, ref, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("denominators", ["positive", "paper"])
@pytest.mark.parametrize("name", LAYERS)
def test_backward_keeps_no_tensor_per_partial_denominator(name, denominators):
    """Partial denominators (..., L, d) or (..., p, d), their linear parts and continuants
    are recomputed in backward, never kept: nothing saved has a depth axis."""
    layer = LAYERS[name](denominators=denominators)
    x = torch.randn(2, 9, 16, requires_grad=True)
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    saved: list[tuple[int, ...]] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.untyped_storage().data_ptr() not in params:
            saved.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = layer(x)
    per_depth = [shape for shape in saved if shape and shape[-1] == layer.depth]
    assert saved and not per_depth, per_depth
    out.sum().backward()
    assert x.grad is not None


@pytest.mark.parametrize("denominators", ["positive", "paper"])
@pytest.mark.parametrize("name", LAYERS)
def test_initialisation_keeps_ladders_off_poles_and_reports_health(name, denominators):
    """At init, on what a block feeds a layer, health is reported and few units clamped.

    Positive denominators have no poles by construction; the paper's are kept off them
    by the init alone, ladder biases at +1 (DENOMINATOR_OFFSET): under 20% of the units
    have |K_d| < 1 (at most 4.3% here, 8.2% over 20 seeds), where biases at 0 put 46%
    to 91% there (at least 39% over 20 seeds; the near-pole count at NEAR_POLE = 0.1
    tells them apart only at odd depths, K_4 of small a_k being ~1)."""
    torch.manual_seed(0)
    layer = LAYERS[name](denominators=denominators)
    assert layer.denominators.has_bias  # the offset is the ladder biases' init
    assert layer.health() is None
    layer.track_health = True
    x = torch.nn.functional.layer_norm(torch.randn(32, 12, 16), (16,))  # what a block feeds it
    layer(x)
    health = layer.health()
    assert health is not None
    assert 0.0 <= health.clamped.item() < 0.01
    assert 0.0 < health.min_abs_kd.item() < float("inf")
    layer.health_near = 1.0
    layer(x)
    assert layer.health().near_pole.item() < 0.2


def test_health_sees_poles():
    layer = Cffn(16, 3, 5, bias=False, denominators="paper")
    with torch.no_grad():
        for w in layer.denominators.weight:
            w.mul_(1e-4)  # small weights, no bias: every a_k ~ 0, K_5 ~ 0
    layer.track_health = True
    layer(torch.randn(4, 16))
    health = layer.health()
    assert health.clamped.item() > 0.5
    assert health.near_pole.item() >= health.clamped.item()
    assert health.max_abs_value.item() > 10


def test_paper_denominators_without_ladder_bias_avoid_most_poles_at_init():
    torch.manual_seed(0)
    layer = Cffn(64, 3, 5, bias=False, denominators="paper")
    layer.track_health = True
    layer(torch.nn.functional.layer_norm(torch.randn(256, 64), (64,)))
    assert layer.health().clamped.item() < 0.03


def _drift(layer: torch.nn.Module, scale: float, bias_std: float, seed: int) -> None:
    """Move every ladder parameter away from its init, as training or a frozen depth under
    a drifting input could: weights x scale, biases to random values of both signs."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in layer.ladder_modules():
            for w in module.weight:
                w.mul_(scale)
            for b in module.bias or ():
                b.copy_(torch.randn(b.shape, generator=g) * bias_std)


@pytest.mark.parametrize("name", LAYERS)
def test_positive_denominators_keep_every_layer_off_poles(name):
    """Pole safety is a property of the layer, not of its init: after any drift of its
    ladder parameters and on inputs far larger than a LayerNorm gives, no unit is near a
    pole, ladder outputs stay within 1 / floor and ladder gradients stay bounded. The same
    drift puts the paper's denominators on poles (so the test can fail)."""
    torch.manual_seed(0)
    worst = {"positive": 0.0, "paper": 0.0}
    for scale, bias_std, x_std in ((1.0, 0.3, 1.0), (1.0, 3.0, 3.0), (20.0, 3.0, 10.0)):
        x = x_std * torch.randn(4, 12, 16)
        for denominators in worst:
            layer = LAYERS[name](denominators=denominators)
            _drift(layer, scale, bias_std, seed=1)
            layer.track_health = True
            out = layer(x)
            health = layer.health()
            worst[denominators] = max(worst[denominators], health.near_pole.item())
            if denominators == "positive":
                out.square().mean().backward()
                grads = [p.grad.abs().max().item() for p in layer.ladder_parameters()]
                assert health.min_abs_kd.item() >= min(1.0, layer.floor) * (1 - 1e-6)
                assert health.max_abs_value.item() <= 1 / layer.floor * (1 + 1e-6)
                assert torch.isfinite(out).all() and max(grads) < 1e6
    assert worst["positive"] == 0.0
    assert worst["paper"] > 0.0


@pytest.mark.parametrize("name", LAYERS)
def test_eval_clips_ladder_outputs_to_the_training_range(name):
    torch.manual_seed(0)
    layer = LAYERS[name](denominators="paper")
    x = torch.nn.functional.layer_norm(torch.randn(4, 12, 16), (16,))
    for _ in range(3):
        layer(x)  # training mode: the range is recorded
    low, high = layer.output_range.low.clone(), layer.output_range.high.clone()
    assert torch.isfinite(low).any() and (low <= high).all()
    layer.eval()
    assert torch.equal(layer(x), layer(x))
    with torch.no_grad():
        same = layer(x)
        # Narrow the recorded range: eval outputs change, training outputs do not.
        layer.output_range.high.copy_(torch.where(torch.isfinite(low), low, high))
        clipped = layer(x)
    assert not torch.allclose(same, clipped)
    layer.train()
    with torch.no_grad():
        layer.output_range.high.copy_(high)
    assert torch.allclose(layer(x), same)
    # The range is part of the state dict; one without it (an older checkpoint) still loads.
    state = layer.state_dict()
    assert "output_range.low" in state and "output_range.high" in state
    fresh = LAYERS[name](denominators="paper")
    old = {k: v for k, v in state.items() if not k.startswith("output_range.")}
    fresh.load_state_dict(old)
    assert torch.isinf(fresh.output_range.low).all()
    # Without clipping there is no range at all.
    assert LAYERS[name](clip_outputs=False).output_range is None


def test_output_range_widens_at_once_and_forgets_slowly():
    from cofrgenet.nn.ladder import OutputRange

    r = OutputRange((2,), momentum=0.5)
    r(torch.tensor([[0.0, 1.0], [2.0, 3.0]]))  # first batch: its extremes
    assert r.low.tolist() == [0.0, 1.0] and r.high.tolist() == [2.0, 3.0]
    r(torch.tensor([[-1.0, 1.5]]))  # wider low on ladder 0: taken at once
    assert r.low.tolist() == [-1.0, 1.25] and r.high.tolist() == [0.5, 2.25]
    r.eval()
    assert r(torch.tensor([[5.0, -5.0]])).tolist() == [[0.5, 1.25]]


def test_output_range_keeps_its_range_through_a_non_finite_batch():
    """One NaN or inf in a training batch (the step the non-finite-loss guard skips) must
    not become a bound: eval would then clip every output, clean ones too, to NaN."""
    from cofrgenet.nn.ladder import OutputRange

    r = OutputRange((3,), momentum=0.5)
    r(torch.tensor([[0.0, 1.0, 2.0], [1.0, 2.0, 3.0]]))
    r(torch.tensor([[float("nan"), float("inf"), 2.5], [1.0, float("-inf"), 2.5]]))
    assert r.low.tolist() == [0.0, 1.0, 2.25] and r.high.tolist() == [1.0, 2.0, 2.75]
    fresh = OutputRange((1,))
    fresh(torch.tensor([[float("nan")]]))  # never seen a finite value: still unseen
    assert torch.isinf(fresh.low).all() and torch.isinf(fresh.high).all()
    layer = Cffn(8, 3, 2)
    x = torch.randn(4, 5, 8)
    with torch.no_grad():
        layer(x)
        poisoned = x.clone()
        poisoned[0, 0, 0] = float("inf")
        layer(poisoned)
        layer.eval()
        assert torch.isfinite(layer(x)).all()


def test_output_range_forgets_in_bf16_true_training():
    """Lightning's bf16-true builds the model under a bf16 default dtype and casts it with
    .to(bfloat16): the range stays float32, else a step's drift (momentum x the gap)
    rounds away and an early extreme is never forgotten. Device moves and float64 still
    apply."""
    from cofrgenet.nn.ladder import OutputRange

    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        r = OutputRange((1,))
    finally:
        torch.set_default_dtype(default)
    r = r.to(torch.bfloat16)
    assert r.low.dtype == r.high.dtype == torch.float32
    r(torch.tensor([[-100.0], [100.0]], dtype=torch.bfloat16))  # an early extreme
    for _ in range(50):  # then batches within [-1, 1]: momentum 0.01 a step
        r(torch.tensor([[-1.0], [1.0]], dtype=torch.bfloat16))
    assert r.high.item() < 100 * 0.99**50 + 1.01
    assert Cffn(8, 2, 3).bfloat16().output_range.low.dtype == torch.float32
    assert r.double().low.dtype == torch.float64
    assert r.to("meta").low.device.type == "meta"


def test_output_range_takes_every_rank_s_extremes_in_one_exchange(monkeypatch):
    """Under data parallelism: one all_reduce per forward (it runs in every ladder layer of
    every step), and the range is the min / max over both ranks' batches."""
    import cofrgenet.nn.ladder as ladder

    other_rank = torch.tensor([[-4.0, 0.5], [1.0, 9.0]])  # what the second rank saw
    calls = []

    def all_reduce(tensor, op):  # rank 0's view of a MAX over ranks 0 and 1
        assert op == ladder.dist.ReduceOp.MAX
        calls.append(tensor.shape)
        theirs = torch.stack([other_rank.amin(0).neg(), other_rank.amax(0)])
        tensor.copy_(torch.maximum(tensor, theirs))

    monkeypatch.setattr(ladder.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(ladder.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(ladder.dist, "all_reduce", all_reduce)
    r = ladder.OutputRange((2,))
    r(torch.tensor([[0.0, 1.0], [2.0, 3.0]]))
    assert len(calls) == 1
    assert r.low.tolist() == [-4.0, 0.5] and r.high.tolist() == [2.0, 9.0]


def test_no_weight_decay_names_ladder_biases_and_cattn_u_linear_terms():
    cffn = Cffn(8, 2, 3)
    assert cffn.no_weight_decay() == {f"denominators.bias.{k}" for k in range(3)}
    assert Cffn(8, 2, 3, bias=False).no_weight_decay() == set()
    assert CAttnU(8, 6, 2).no_weight_decay() == {
        "denominators.bias.0",
        "denominators.bias.1",
        "linear",
    }
    names = {n for n, _ in CAttnM(8, 6, 2, 2).named_parameters()}
    assert CAttnM(8, 6, 2, 2).no_weight_decay() <= names


def test_bad_denominators():
    with pytest.raises(ValueError, match="unknown denominators 'linear'"):
        Cffn(8, 2, 2, denominators="linear")
    with pytest.raises(ValueError, match="floor must be a finite positive number"):
        CAttnM(8, 6, 2, 2, floor=0.0)


@pytest.mark.parametrize("name", LAYERS)
def test_ladder_parameters_by_depth(name):
    layer = LAYERS[name]()
    by_depth = layer.ladder_parameters_by_depth()
    depth = next(layer.ladder_modules()).depth
    assert sorted(by_depth) == list(range(1, depth + 1))
    ladder_ids = {id(p) for p in layer.ladder_parameters()}
    assert ladder_ids == {id(p) for ps in by_depth.values() for p in ps}
    # Freezing one depth leaves it without a gradient while the rest train.
    for p in by_depth[depth]:
        p.requires_grad_(False)
    x = torch.randn(2, 12, 16)
    layer(x).sum().backward()
    assert all(p.grad is None for p in by_depth[depth])
    if depth > 1:
        assert all(p.grad is not None for p in by_depth[1])


def test_sequences_longer_than_max_len_are_refused():
    with pytest.raises(ValueError, match="max_len=12"):
        CAttnU(16, 12, 2)(torch.randn(1, 13, 16))
    with pytest.raises(ValueError, match="max_len=12"):
        CAttnM(16, 12, 2, 2)(torch.randn(1, 13, 16))


def test_bad_arguments():
    with pytest.raises(ValueError, match="ladder kind"):
        Cffn(8, 2, 2, ladder="diagonal")
    with pytest.raises(ValueError, match="depth must be >= 1"):
        LadderWeights(0, (2, 3))
    with pytest.raises(ValueError, match="at least one ladder"):
        Cffn(8, 0, 2)


def test_layers_build_on_meta_device():
    with torch.device("meta"):
        layers = [Cffn(64, 3, 5), CAttnU(64, 32, 3), CAttnM(64, 32, 3, 3)]
    assert all(p.is_meta for layer in layers for p in layer.parameters())


def test_stacked_weights_read_depths_that_fsdp_set_as_plain_tensors():
    """FSDP (use_orig_params) replaces a unit's parameters by plain tensor views while it
    recomputes a checkpointed block in backward; the stacks still hold every depth."""
    weights = LadderWeights(3, (2, 4), (2,))
    weights.reset_parameters(0.5)
    want = torch.stack([w.detach() * 2 for w in weights.weight])
    for k, param in enumerate(list(weights.weight)):
        delattr(weights.weight, str(k))
        setattr(weights.weight, str(k), param.detach() * 2)  # as FSDP's unsharded views
    assert not list(weights.weight.parameters())
    torch.testing.assert_close(weights.stacked_weight(), want, rtol=0, atol=0)


def test_reusing_stacked_weights_stacks_once_per_block_and_only_without_autograd():
    """Generation stacks each ladder's per-depth weights once (``reusing_stacked_weights``);
    outside the block, or with autograd on, every call stacks afresh."""
    from cofrgenet.nn import LadderWeights, reusing_stacked_weights

    weights = LadderWeights(3, (2, 4), (2,))
    weights.reset_parameters(0.5)
    with torch.no_grad():
        assert weights.stacked_weight() is not weights.stacked_weight()
        with reusing_stacked_weights():
            first, bias = weights.stacked_weight(), weights.stacked_bias()
            assert weights.stacked_weight() is first and weights.stacked_bias() is bias
            torch.testing.assert_close(first, torch.stack(list(weights.weight)))
            with torch.enable_grad():
                fresh = weights.stacked_weight()
                assert fresh is not first and fresh.requires_grad
        assert weights.stacked_weight() is not first  # the block's stacks are gone


@pytest.mark.parametrize(
    "make",
    [lambda: Cffn(8, 2, 3), lambda: CAttnU(8, 8, 3), lambda: CAttnM(8, 8, 2, 3)],
    ids=["cffn", "cattn_u", "cattn_m"],
)
def test_an_empty_batch_trains_and_leaves_the_ranges_as_they_were(make):
    """A batch of no rows (or no tokens) in training: recording its output range took
    amin over nothing (IndexError), where a plain GPT-2 block returns an empty output."""
    from cofrgenet.ops import denominator_stats

    torch.manual_seed(0)
    layer = make()
    layer(torch.randn(2, 5, 8))
    ranges = [b.clone() for b in layer.output_range.buffers()]
    for empty in (torch.randn(0, 5, 8), torch.randn(2, 0, 8)):
        out = layer(empty.requires_grad_())
        out.sum().backward()
        assert out.shape == empty.shape
    assert all(torch.equal(a, b) for a, b in zip(ranges, layer.output_range.buffers(), strict=True))
    stats = denominator_stats(torch.rand(0, 3))  # the health of no units
    assert (stats.clamped, stats.near_pole, stats.max_abs_value) == (0, 0, 0)
    assert stats.min_abs_kd == float("inf")


@pytest.mark.parametrize(
    "make", [lambda: CAttnU(11, 8, 3), lambda: CAttnM(11, 8, 2, 3)], ids=["u", "m"]
)
def test_an_attention_input_of_another_shape_is_named_so(make):
    """A (T, C) input read its channels as its length ("at most max_len=8 tokens, got
    11") or failed to unpack; CAttnU took a width other than its own."""
    layer = make()
    name = type(layer).__name__
    for shape in [(6, 11), (2, 6, 12)]:
        with pytest.raises(
            ValueError, match=rf"{name} takes \(batch, tokens, channels=11\) inputs, got shape"
        ):
            layer(torch.randn(*shape))
    with pytest.raises(ValueError, match="at most max_len=8 tokens"):
        layer(torch.randn(2, 9, 11))
    assert layer(torch.randn(2, 6, 11)).shape == (2, 6, 11)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Cffn(0, 1, 1), "Cffn needs dim >= 1, got 0"),
        (lambda: CAttnM(0, 8, 1, 1), "CAttnM needs dim >= 1, got 0"),
        (lambda: CAttnU(8, 0, 1), "CAttnU needs max_len >= 1, got 0"),
        (lambda: Cffn(8, 2, 3, impl="tritn"), "unknown impl 'tritn'"),
        (lambda: CAttnU(8, 8, 3, grad="exactt"), "unknown grad mode 'exactt'"),
        (lambda: CAttnM(8, 8, 2, 3, eps=-1), "eps must be a positive finite number"),
    ],
)
def test_a_layer_refuses_its_bad_options_when_built(make, message):
    """They failed at the first forward (impl, grad, eps) or with a ZeroDivisionError."""
    with pytest.raises(ValueError, match=message):
        make()
