"""Convolution and pooling (ir/windows.py) against direct numpy loops over their windows, in float64."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.ir.errors import ShapeError


def _windowed(x: np.ndarray, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...],
              fill: float = 0.0, padding: tuple[int, ...] = ()) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """x (..., *spatial) padded with `fill`; each output position's window as an array (..., *kernel)."""
    dims = len(kernel)
    padding = padding or (0,) * dims
    padded = np.pad(x, [(0, 0)] * (x.ndim - dims) + [(p, p) for p in padding], constant_values=fill)
    out = [(n - d * (k - 1) - 1) // s + 1 for n, k, s, d in zip(padded.shape[-dims:], kernel, stride, dilation)]
    windows = {}
    for at in itertools.product(*(range(o) for o in out)):
        index = tuple(slice(a * s, a * s + d * (k - 1) + 1, d) for a, k, s, d in zip(at, kernel, stride, dilation))
        windows[at] = padded[(Ellipsis,) + index]
    return windows, out


def _conv(x: np.ndarray, w: np.ndarray, stride, padding, dilation, groups) -> np.ndarray:
    windows, out = _windowed(x, w.shape[2:], stride, dilation, padding=padding)
    n, c = x.shape[:2]
    o, per = w.shape[0], c // groups
    y = np.zeros((n, o, *out))
    for at, window in windows.items():
        for g in range(groups):
            part = window[:, g * per:(g + 1) * per]
            filters = w[g * (o // groups):(g + 1) * (o // groups)]
            y[(slice(None), slice(g * (o // groups), (g + 1) * (o // groups))) + at] = np.tensordot(
                part, filters, axes=(list(range(1, part.ndim)), list(range(1, filters.ndim))))
    return y


@pytest.mark.parametrize("shape, weight, stride, padding, dilation, groups", [
    ((2, 3, 9, 7), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((1, 4, 11, 10), (6, 2, 3, 2), (2, 3), (2, 0), (2, 1), 2),
    ((2, 5, 8, 8), (5, 1, 3, 3), (2, 2), (1, 1), (1, 1), 5),       # depthwise
    ((2, 3, 8, 12), (7, 3, 4, 4), (4, 4), (0, 0), (1, 1), 1),      # tiles the input: a patch embedding
    ((3, 2, 17), (4, 2, 5), (3,), (2,), (1,), 1),                  # one spatial axis
    ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2), (1, 2, 3), (1, 0, 1), (1, 1, 2), 1),   # three
])
def test_a_convolution_is_the_sum_over_each_window(shape, weight, stride, padding, dilation, groups, rng) -> None:
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in (shape, weight, weight[:1]))
    g = ts.Graph("conv")
    tx, tw, tb = g.input("x", shape, "float32"), g.input("w", weight, "float32"), g.input("b", b.shape, "float32")
    g.output("y", nn.conv(tx, tw, tb, stride, padding, dilation, groups))
    got = ts.evaluate(g, {"x": x, "w": w, "b": b})["y"]
    expected = _conv(x.astype(np.float64), w.astype(np.float64), stride, padding, dilation, groups)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected + b.reshape((1, -1) + (1,) * (len(shape) - 2)), rtol=1e-10, atol=1e-10)


def _conv_transpose(x: np.ndarray, w: np.ndarray, stride, padding, output_padding, dilation, groups) -> np.ndarray:
    """Each input element's kernel, scaled by it, added into the output at element * stride + tap * dilation -
    padding: the transposed convolution by its definition, one element at a time."""
    n, c, *spatial = x.shape
    kernel, per, group_out = w.shape[2:], c // groups, w.shape[1]
    out = [(size - 1) * s - 2 * p + d * (k - 1) + e + 1
           for size, s, p, d, k, e in zip(spatial, stride, padding, dilation, kernel, output_padding)]
    y = np.zeros((n, groups * group_out, *out))
    for at in itertools.product(*(range(size) for size in spatial)):
        for tap in itertools.product(*(range(k) for k in kernel)):
            where = [a * s + t * d - p for a, t, s, d, p in zip(at, tap, stride, dilation, padding)]
            if not all(0 <= i < o for i, o in zip(where, out)):
                continue
            for g in range(groups):
                inputs = x[(slice(None), slice(g * per, (g + 1) * per)) + at]            # (N, per)
                filters = w[(slice(g * per, (g + 1) * per), slice(None)) + tap]         # (per, group_out)
                y[(slice(None), slice(g * group_out, (g + 1) * group_out)) + tuple(where)] += inputs @ filters
    return y


@pytest.mark.parametrize("shape, weight, stride, padding, output_padding, dilation, groups", [
    ((2, 3, 5, 4), (3, 4, 3, 3), (2, 2), (1, 1), (1, 0), (1, 1), 1),      # a decoder's upsampling
    ((1, 4, 6, 5), (4, 3, 4, 4), (2, 2), (1, 1), (0, 0), (1, 1), 2),      # 4 x 4, stride 2, in two groups
    ((2, 2, 7), (2, 3, 5), (3,), (0,), (2,), (2,), 1),                   # dilated, one spatial axis
    ((1, 3, 4, 4), (3, 2, 2, 2), (2, 2), (0, 0), (0, 0), (1, 1), 1),      # taps that tile the output
    ((1, 2, 3, 3), (2, 2, 3, 3), (1, 1), (2, 2), (0, 0), (1, 1), 1),      # padding crops most of each tap
    ((1, 2, 1, 1), (2, 2, 3, 3), (1, 1), (1, 1), (0, 0), (1, 1), 1),      # and all of eight taps
])
def test_a_transposed_convolution_spreads_each_element_over_its_kernel(shape, weight, stride, padding,
                                                                        output_padding, dilation, groups, rng) -> None:
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in (shape, weight, (weight[1] * groups,)))
    g = ts.Graph("conv_transpose")
    tx, tw, tb = g.input("x", shape, "float32"), g.input("w", weight, "float32"), g.input("b", b.shape, "float32")
    g.output("y", nn.conv_transpose(tx, tw, tb, stride, padding, output_padding, groups, dilation))
    got = ts.evaluate(g, {"x": x, "w": w, "b": b})["y"]
    expected = _conv_transpose(x.astype(np.float64), w.astype(np.float64), stride, padding, output_padding,
                               dilation, groups)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected + b.reshape((1, -1) + (1,) * (len(shape) - 2)), rtol=1e-10, atol=1e-10)


def test_a_transposed_convolution_without_an_output_says_why() -> None:
    g = ts.Graph("bad")
    x, w = g.input("x", (1, 2, 4), "float32"), g.input("w", (2, 2, 3), "float32")
    with pytest.raises(ShapeError, match="output_padding"):
        nn.conv_transpose(x, w, stride=2, output_padding=2)
    for bad in ({"stride": 0}, {"dilation": 0}, {"groups": 0}):
        with pytest.raises(ShapeError, match="at least 1|group"):
            nn.conv_transpose(x, w, **bad)


def test_max_and_average_pooling_are_the_max_and_mean_of_each_window(rng) -> None:
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    g = ts.Graph("pool")
    tx = g.input("x", x.shape, "float32")
    g.output("max", nn.max_pool(tx, (3, 3), (2, 2), (1, 1)))
    g.output("mean", nn.avg_pool(tx, (3, 2), (2, 1), (1, 1)))
    g.output("mean_inside", nn.avg_pool(tx, (3, 2), (2, 1), (1, 1), count_include_pad=False))
    g.output("adaptive", nn.adaptive_avg_pool(tx, (3, 4)))
    got = ts.evaluate(g, {"x": x})
    wide = x.astype(np.float64)
    windows, out = _windowed(wide, (3, 3), (2, 2), (1, 1), fill=-np.inf, padding=(1, 1))
    np.testing.assert_array_equal(got["max"], np.stack([w.max(axis=(-2, -1)) for w in windows.values()], -1)
                                  .reshape(2, 3, *out))
    windows, out = _windowed(wide, (3, 2), (2, 1), (1, 1), padding=(1, 1))
    counts, _ = _windowed(np.ones((9, 8)), (3, 2), (2, 1), (1, 1), padding=(1, 1))
    sums = np.stack([w.sum(axis=(-2, -1)) for w in windows.values()], -1).reshape(2, 3, *out)
    inside = np.array([c.sum() for c in counts.values()]).reshape(out)
    np.testing.assert_allclose(got["mean"], sums / 6, rtol=1e-12)
    np.testing.assert_allclose(got["mean_inside"], sums / inside, rtol=1e-12)
    np.testing.assert_allclose(got["adaptive"], wide.reshape(2, 3, 3, 3, 4, 2).mean(axis=(3, 5)), rtol=1e-12)


def test_windows_that_cannot_be_made_are_one_clear_error() -> None:
    g = ts.Graph("bad")
    x = g.input("x", (1, 4, 7, 7), "float32")
    with pytest.raises(ShapeError, match="4 input channels in 3 group"):
        nn.conv(x, g.input("w", (3, 2, 3, 3), "float32"), groups=3)
    with pytest.raises(ShapeError, match="must be positive"):
        nn.adaptive_avg_pool(x, (0, 3))
    with pytest.raises(ShapeError, match="more than half the kernel"):
        nn.max_pool(x, 2, padding=2)


def test_an_unbatched_input_is_convolved_as_a_batch_of_one(rng) -> None:
    x, w = rng.standard_normal((3, 10, 9)).astype(np.float32), rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    g = ts.Graph("unbatched")
    g.output("y", nn.conv(g.input("x", x.shape, "float32"), g.input("w", w.shape, "float32"), stride=2, padding=1))
    got = ts.evaluate(g, {"x": x, "w": w})["y"]
    np.testing.assert_allclose(got, _conv(x[None].astype(np.float64), w.astype(np.float64), (2, 2), (1, 1), (1, 1),
                                          1)[0], rtol=1e-10, atol=1e-10)


def test_windows_that_tile_the_input_are_a_view_of_it_not_slices() -> None:
    """A ViT's patch embedding (stride equal to the kernel, no padding) reads its input through one reshape and
    permute: no slice or pad gathers its windows."""
    from tensorsmith.ir import Op
    g = ts.Graph("patches")
    g.output("y", nn.conv(g.input("x", (2, 3, 16, 16), "float32"), g.input("w", (8, 3, 4, 4), "float32"), stride=4))
    ops = {node.op for node in g.nodes()}
    assert Op.SLICE not in ops and Op.PAD not in ops and Op.RESHAPE in ops and Op.PERMUTE in ops


@pytest.mark.parametrize("shape,size", [((2, 3, 13, 13), (6, 6)), ((1, 2, 7, 9), (3, 4)), ((2, 5, 10), (3,))])
def test_adaptive_average_pooling_over_unequal_windows_matches_its_definition(shape, size, rng) -> None:
    """Output o of an axis of n averages inputs floor(o n / s) to ceil((o + 1) n / s) - 1 (PyTorch's windows, which
    overlap where s does not divide n), here against those windows written out in float64."""
    x = rng.standard_normal(shape).astype(np.float32)
    g = ts.Graph("adaptive")
    g.output("y", nn.adaptive_avg_pool(g.input("x", shape, "float32"), size))
    expected = x.astype(np.float64)
    for d, s in enumerate(size):
        axis, n = len(shape) - len(size) + d, shape[len(shape) - len(size) + d]
        windows = [np.take(expected, range(o * n // s, -(-(o + 1) * n // s)), axis=axis).mean(axis=axis)
                   for o in range(s)]
        expected = np.stack(windows, axis=axis)
    np.testing.assert_allclose(ts.evaluate(g, {"x": x})["y"], expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("shape,kernel,stride,padding", [((1, 2, 7, 7), 2, 2, 0), ((1, 2, 9, 8), 3, 2, 1),
                                                         ((2, 3, 10), 3, 2, 0), ((1, 1, 6, 6), 3, 2, 1)])
def test_ceil_mode_pools_a_last_partial_window_as_pytorch_does(shape, kernel, stride, padding, rng) -> None:
    """ceil_mode's last window reaches past the padded input: max over what it holds; the average divided by what
    it holds of the input and, with count_include_pad, of the padding (not of the part past it)."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x = rng.standard_normal(shape).astype(np.float32)
    dims = len(shape) - 2
    torch_pools = {"max": (F.max_pool1d, F.max_pool2d)[dims - 1], "avg": (F.avg_pool1d, F.avg_pool2d)[dims - 1]}
    for kind, options in [("max", {}), ("avg", {"count_include_pad": True}), ("avg", {"count_include_pad": False})]:
        g = ts.Graph("ceil")
        pool = nn.max_pool if kind == "max" else nn.avg_pool
        g.output("y", pool(g.input("x", shape, "float32"), (kernel,) * dims, stride, padding, ceil_mode=True,
                           **options))
        expected = torch_pools[kind](torch.from_numpy(x), kernel, stride, padding, ceil_mode=True, **options)
        np.testing.assert_allclose(ts.evaluate(g, {"x": x})["y"], expected.numpy(), rtol=1e-6, atol=1e-6)
