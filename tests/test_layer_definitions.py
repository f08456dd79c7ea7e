"""Each CoFrGeNet layer against its definition (spec section 3, docs/layers.md): a plain
float64 re-implementation, loops and all, holds the layer's output and its gradients
w.r.t. the input and every parameter, at odd shapes, in training and in eval (clipping)."""

from __future__ import annotations

import pytest
import torch

from cofrgenet.nn import CAttnM, CAttnU, Cffn
from cofrgenet.ops.reference import reference_pvariate_ladder, reference_univariate_ladder

F64 = torch.float64
WIDTH, MAX_LEN = 5, 9  # odd width; sequences shorter than max_len use the leading block
SHAPES = [(1, 1), (1, 7), (2, 1), (2, 7)]  # (B, T)
CONFIGS = {  # the link floor + softplus, the paper's identity link, no ladder biases
    "positive": {},
    "paper": {"denominators": "paper"},
    "no-ladder-bias": {"ladder_bias": False},
}
MODES = ["train", "eval"]


def _stacked(layer) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The per-depth ladder parameters as (d, ...) tensors: depth k at index k - 1."""
    weights = layer.denominators
    bias = None if weights.bias is None else torch.stack(list(weights.bias))
    return torch.stack(list(weights.weight)), bias


def _clip(layer, z: torch.Tensor, *index) -> torch.Tensor:
    """In eval, ladder outputs are clamped to the range seen in training (entry ``index``)."""
    if layer.training or layer.output_range is None:
        return z
    return torch.clamp(z, layer.output_range.low[index], layer.output_range.high[index])


def cffn_reference(layer: Cffn, x: torch.Tensor) -> torch.Tensor:
    """y = U x^ + V z with x^ = sigmoid(G x) * x; scalar: z_j = f~(link(W^(j) x^ + b^(j)));
    elementwise: z_j[i] = f~(link(x^_i W^(j)[i, :] + b^(j)[i, :])) (U x^, not U x: ours)."""
    gated = torch.sigmoid(layer.gate(x)) * x
    weight, bias = _stacked(layer)  # (d, L, p); (d, L) scalar, (d, L, p) elementwise
    out = layer.linear(gated)
    if layer.ladder == "scalar":
        z = reference_pvariate_ladder(gated, weight, bias, layer.eps, layer.link_floor)
        for j in range(layer.ladders):
            out = out + layer.mix[:, j] * _clip(layer, z[..., j], j).unsqueeze(-1)
        return out
    for j in range(layer.ladders):
        b = None if bias is None else bias[:, j]
        z = reference_univariate_ladder(gated, weight[:, j], b, layer.eps, layer.link_floor)
        out = out + layer.mix[:, j] * _clip(layer, z, j)
    return out


def cattn_u_reference(layer: CAttnU, x: torch.Tensor) -> torch.Tensor:
    """y_e[s, c] = w0_e[s] x[s, c] + f~(link(w_e[., s] x[s, c] + b_e[., s])), then
    O[t, c] = (sum_{s<=t} U_1[s, t] y_1[s, c]) (sum_{s<=t} U_2[s, t] y_2[s, c])."""
    length, dim = x.shape[1], x.shape[2]
    weight, bias = _stacked(layer)  # (d, 2, l)
    mixing = torch.zeros(2, layer.max_len, layer.max_len, dtype=x.dtype)
    packed = 0  # `mixing` holds the upper triangles s <= t row by row
    for s in range(layer.max_len):
        for t in range(s, layer.max_len):
            mixing[:, s, t] = layer.mixing[:, packed]
            packed += 1
    y = [[], []]  # y[e][s]: (B, p)
    for e in range(2):
        for s in range(length):
            w = weight[:, e, s, None].expand(-1, dim)  # position s's ladder, every channel
            b = None if bias is None else bias[:, e, s, None].expand(-1, dim)
            f = reference_univariate_ladder(x[:, s], w, b, layer.eps, layer.link_floor)
            y[e].append(layer.linear[e, s] * x[:, s] + _clip(layer, f, e, s))
    out = []
    for t in range(length):
        u1, u2 = (sum(mixing[e, s, t] * y[e][s] for s in range(t + 1)) for e in range(2))
        out.append(u1 * u2)
    return torch.stack(out, dim=1)


def cattn_m_reference(layer: CAttnM, x: torch.Tensor) -> torch.Tensor:
    """Y[t, j] = f~(link(W^(j) x_t + b^(j))), A = causal_softmax(Y F), O = A X W^v."""
    weight, bias = _stacked(layer)  # (d, L, p), (d, L)
    y = reference_pvariate_ladder(x, weight, bias, layer.eps, layer.link_floor)  # (B, T, L)
    y = torch.stack([_clip(layer, y[..., j], j) for j in range(layer.ladders)], dim=-1)
    values = layer.value(x)  # X W^v (+ bias)
    out = []
    for t in range(x.shape[1]):
        logits = y[:, t] @ layer.position_map[:, : t + 1]  # keys s <= t: (B, t + 1)
        out.append(torch.einsum("bs,bsc->bc", logits.softmax(-1), values[:, : t + 1]))
    return torch.stack(out, dim=1)


def _prepare(layer, mode: str):
    """float64, every parameter moved off its (symmetric) init; in eval, a training range
    recorded on other inputs and its upper half cut off, so that the clip is exercised."""
    layer = layer.double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
        if mode == "eval":
            layer(torch.randn(4, MAX_LEN, WIDTH, dtype=F64))  # training mode: records
            seen = layer.output_range
            seen.high.copy_((seen.low + seen.high) / 2)
            layer.eval()
    return layer


def _check(layer, reference, batch: int, length: int) -> None:
    """Output and gradients (input and every named parameter) agree at float64 precision."""
    x = torch.randn(batch, length, WIDTH, dtype=F64, requires_grad=True)
    names, params = zip(*layer.named_parameters(), strict=True)
    out = layer(x)
    want = reference(layer, x)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
    cotangent = torch.randn_like(out)
    got = torch.autograd.grad(out, [x, *params], cotangent)
    expected = torch.autograd.grad(want, [x, *params], cotangent)
    for name, g, e in zip(["input", *names], got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")
    if not layer.training and length > 1:  # the eval range clips ladder outputs that count
        with torch.no_grad():
            unclipped = reference(layer.train(), x)
        layer.eval()
        assert not torch.allclose(want, unclipped)


@pytest.mark.parametrize("batch,length", SHAPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("ladder", ["scalar", "elementwise"])
def test_cffn_matches_its_definition(ladder, config, mode, batch, length):
    """Cffn (both ladder readings) is U x^ + V z of the gated input, forward and backward."""
    torch.manual_seed(0)
    layer = _prepare(Cffn(WIDTH, 3, 4, ladder=ladder, **CONFIGS[config]), mode)
    _check(layer, cffn_reference, batch, length)


@pytest.mark.parametrize("batch,length", SHAPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("config", CONFIGS)
def test_cattn_u_matches_its_definition(config, mode, batch, length):
    """CAttnU is the product of two causal mixes of full univariate ladders along tokens."""
    torch.manual_seed(0)
    layer = _prepare(CAttnU(WIDTH, MAX_LEN, 3, **CONFIGS[config]), mode)
    _check(layer, cattn_u_reference, batch, length)


@pytest.mark.parametrize("batch,length", SHAPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("config", CONFIGS)
def test_cattn_m_matches_its_definition(config, mode, batch, length):
    """CAttnM is causal softmax attention with logits Y F and values X W^v."""
    torch.manual_seed(0)
    layer = _prepare(CAttnM(WIDTH, MAX_LEN, 3, 4, **CONFIGS[config]), mode)
    _check(layer, cattn_m_reference, batch, length)
