"""Layers over sliding windows, as compositions of primitives: convolution (one matrix product per group over the
windows gathered as columns, "im2col"), transposed convolution (one product per group, its taps spread and added)
and max, average and adaptive average pooling. Each window offset is a
strided view of the padded input, made of slices and reshapes; windows that tile the input (a ViT's patch
embedding: stride equal to the kernel, no padding) are one reshape and permute of it."""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence

from .dtypes import LARGEST_FINITE, DType
from .errors import ShapeError
from .tensor import Tensor, concat, constant, iota, logical_and, maximum, where

Size = int | Sequence[int]
Pads = int | Sequence[int] | Sequence[tuple[int, int]]   # one for all axes, one per axis, or (before, after) per axis


def conv(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Size = 1, padding: Size = 0,
         dilation: Size = 1, groups: int = 1) -> Tensor:
    """PyTorch's conv1d/conv2d/conv3d: x (N, C, *spatial) or (C, *spatial), weight (O, C / groups, *kernel)."""
    dims = weight.ndim - 2
    if dims < 1 or x.ndim not in (dims + 1, dims + 2):
        raise ShapeError(f"conv: a weight of shape {weight.shape} takes inputs of {dims + 1} or {dims + 2} axes,"
                         f" got {x.shape}")
    if x.ndim == dims + 1:
        batched = conv(x.reshape((1,) + x.shape), weight, bias, stride, padding, dilation, groups)
        return batched.reshape(batched.shape[1:])
    channels, out_channels, kernel = x.shape[1], weight.shape[0], weight.shape[2:]
    if channels != weight.shape[1] * groups or out_channels % groups:
        raise ShapeError(f"conv: {channels} input channels in {groups} group(s) do not fit a weight of shape"
                         f" {weight.shape}")
    stride, padding, dilation = (_per_axis(value, dims, name) for value, name in
                                 ((stride, "stride"), (padding, "padding"), (dilation, "dilation")))
    pads = [(p, p) for p in padding]
    out = _out_sizes(x.shape[2:], kernel, stride, pads, dilation)
    per_group, taps = channels // groups, math.prod(kernel)
    if per_group == 1 and out_channels == groups:   # depthwise: each channel its own filter, no sum over channels
        windows = _windows(x.pad([(0, 0), (0, 0)] + pads), kernel, stride, dilation, out)
        taps_weights = weight.reshape(out_channels, taps)
        y = _summed(w * taps_weights[:, t].reshape((1, channels) + (1,) * dims) for t, w in enumerate(windows))
    else:   # the windows as columns (N, *out, C * taps), channel-major as the weight is: a product per group
        columns = _columns(x, kernel, stride, pads, dilation, out)
        flat = weight.reshape(out_channels, per_group * taps)
        step, width = out_channels // groups, per_group * taps
        parts = [columns[(slice(None),) * (dims + 1) + (slice(g * width, (g + 1) * width),)]
                 @ flat[g * step:(g + 1) * step].transpose(0, 1) for g in range(groups)]
        y = parts[0] if groups == 1 else concat(parts, dims + 1)
        y = y.permute((0, dims + 1) + tuple(range(1, dims + 1)))
    return y if bias is None else y + bias.reshape((1, out_channels) + (1,) * dims)


def conv_transpose(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Size = 1, padding: Size = 0,
                   output_padding: Size = 0, groups: int = 1, dilation: Size = 1) -> Tensor:
    """PyTorch's conv_transpose1d/2d/3d: x (N, C, *spatial) or (C, *spatial), weight (C, O / groups, *kernel).

    Each input element spreads its kernel over the output: one product per group gives every element's
    contribution to every tap, (N, *spatial, O * taps); each tap's is then spread `stride` apart (zeros between) and
    placed at its offset, `tap * dilation - padding`, and the taps are added up. No weight is flipped."""
    dims = weight.ndim - 2
    if dims < 1 or x.ndim not in (dims + 1, dims + 2):
        raise ShapeError(f"conv_transpose: a weight of shape {weight.shape} takes inputs of {dims + 1} or {dims + 2}"
                         f" axes, got {x.shape}")
    if x.ndim == dims + 1:
        batched = conv_transpose(x.reshape((1,) + x.shape), weight, bias, stride, padding, output_padding, groups,
                                 dilation)
        return batched.reshape(batched.shape[1:])
    n, channels, spatial, kernel = x.shape[0], x.shape[1], x.shape[2:], weight.shape[2:]
    if groups < 1 or channels != weight.shape[0] or channels % groups:
        raise ShapeError(f"conv_transpose: {channels} input channels in {groups} group(s) do not fit a weight of"
                         f" shape {weight.shape}")
    stride, padding, output_padding, dilation = (
        _per_axis(value, dims, name) for value, name in ((stride, "stride"), (padding, "padding"),
                                                         (output_padding, "output_padding"), (dilation, "dilation")))
    if groups < 1 or min(stride + dilation) < 1:
        raise ShapeError(f"conv_transpose: stride {stride}, dilation {dilation} and groups {groups} must be at least 1")
    out = [(size - 1) * s - 2 * p + d * (k - 1) + extra + 1
           for size, s, p, d, k, extra in zip(spatial, stride, padding, dilation, kernel, output_padding)]
    if any(size < 1 for size in out) or any(extra >= max(s, d) for extra, s, d in zip(output_padding, stride,
                                                                                        dilation)):
        raise ShapeError(f"conv_transpose: an input of {tuple(spatial)} with kernel {tuple(kernel)}, stride {stride},"
                         f" padding {padding}, output_padding {output_padding} and dilation {dilation} has no output")
    per_group, group_out, taps = channels // groups, weight.shape[1], math.prod(kernel)
    rows = x.permute((0,) + tuple(range(2, dims + 2)) + (1,))          # (N, *spatial, C)
    flat = weight.reshape(channels, group_out * taps)                   # (C, O / groups * taps), out-channel-major
    parts = [rows[(slice(None),) * (dims + 1) + (slice(g * per_group, (g + 1) * per_group),)]
             @ flat[g * per_group:(g + 1) * per_group] for g in range(groups)]
    spread = (parts[0] if groups == 1 else concat(parts, dims + 1)).reshape(
        (n, *spatial, groups * group_out, taps))
    channel_first = (0, dims + 1) + tuple(range(1, dims + 1))
    placed = []
    for t, offsets in enumerate(_offsets(kernel)):
        tap: Tensor | None = spread[(slice(None),) * (dims + 2) + (t,)].permute(channel_first)   # (N, O, *spatial)
        for axis, (offset, s, p, d, size) in enumerate(zip(offsets, stride, padding, dilation, out)):
            if tap is not None:
                tap = _placed(_spread(tap, axis + 2, s), axis + 2, offset * d - p, size)
        if tap is not None:   # (a tap whose every element falls in the padding adds nothing)
            placed.append(tap)
    y = _summed(placed) if placed else constant(0.0, (n, groups * group_out, *out), x.dtype)
    return y if bias is None else y + bias.reshape((1, groups * group_out) + (1,) * dims)


def _spread(x: Tensor, axis: int, step: int) -> Tensor:
    """x with step - 1 zeros between its elements along `axis` (length (L - 1) * step + 1)."""
    if step == 1:
        return x
    length = x.shape[axis]
    split = x.reshape(x.shape[:axis + 1] + (1,) + x.shape[axis + 1:])
    split = split.pad([(0, 0)] * (axis + 1) + [(0, step - 1)] + [(0, 0)] * (x.ndim - axis - 1))
    joined = split.reshape(x.shape[:axis] + (length * step,) + x.shape[axis + 1:])
    return joined[(slice(None),) * axis + (slice(0, (length - 1) * step + 1),)]


def _placed(x: Tensor, axis: int, start: int, size: int) -> Tensor | None:
    """x along `axis` placed at `start` of an axis of `size` (zeros elsewhere; what falls outside it dropped), or
    None where all of it falls outside."""
    length, before = x.shape[axis], (slice(None),) * axis
    if start >= size or start + length <= 0:
        return None
    if start < 0:
        x, length, start = x[before + (slice(-start, length),)], length + start, 0
    if start + length > size:
        x, length = x[before + (slice(0, size - start),)], size - start
    widths = [(0, 0)] * x.ndim
    widths[axis] = (start, size - start - length)
    return x.pad(widths)


def max_pool(x: Tensor, kernel: Size, stride: Size | None = None, padding: Pads = 0, dilation: Size = 1,
             ceil_mode: bool = False) -> Tensor:
    """PyTorch's max_pool over the last len(kernel) axes (an int kernel: the last axis). The padding is the
    dtype's lowest finite value, so it never wins a window that holds an element (PyTorch's -inf, unless a window
    is all padding); `padding` may give each axis its (before, after) pair, as ONNX does."""
    kernel, stride, pads, dilation, out, overhang = _pooling(x, kernel, stride, padding, dilation, ceil_mode,
                                                             "max_pool")
    widths = [(0, 0)] * (x.ndim - len(kernel)) + [(b, a + extra) for (b, a), extra in zip(pads, overhang)]
    inside = constant(1.0, x.shape, DType.FLOAT32).pad(widths) > 0.5
    padded = where(inside, x.pad(widths), constant(_lowest(x.dtype), (), x.dtype))
    return functools.reduce(maximum, _windows(padded, kernel, stride, dilation, out))


def avg_pool(x: Tensor, kernel: Size, stride: Size | None = None, padding: Pads = 0, ceil_mode: bool = False,
             count_include_pad: bool = True, divisor_override: int | None = None, dilation: Size = 1) -> Tensor:
    """PyTorch's avg_pool over the last len(kernel) axes (an int kernel: the last axis); `padding` may give each
    axis its (before, after) pair and `dilation` spread the window, as ONNX's AveragePool does."""
    kernel, stride, pads, dilation, out, overhang = _pooling(x, kernel, stride, padding, dilation, ceil_mode,
                                                             "avg_pool")
    dims = len(kernel)
    reach = [(b, a + extra) for (b, a), extra in zip(pads, overhang)]   # ceil mode's last window may reach past
    total = _summed(_windows(x.pad([(0, 0)] * (x.ndim - dims) + reach), kernel, stride, dilation, out))
    if divisor_override:
        return total / float(divisor_override)
    if not any(overhang) and (count_include_pad or not any(b or e for b, e in pads)):
        return total / float(math.prod(kernel))
    spatial = x.shape[x.ndim - dims:]   # a window's divisor counts the input, and its padding where that is counted
    if count_include_pad:               # (not the part past it: PyTorch divides a last, partial window by less)
        counted = constant(1.0, [n + b + a for n, (b, a) in zip(spatial, pads)], x.dtype)
        reach = [(0, extra) for extra in overhang]
    else:
        counted = constant(1.0, spatial, x.dtype)
    return total / _summed(_windows(counted.pad(reach), kernel, stride, dilation, out, lead=0))


def adaptive_avg_pool(x: Tensor, output_size: Size) -> Tensor:
    """PyTorch's adaptive_avg_pool: output o of an axis of n averages inputs floor(o n / s) to ceil((o + 1) n / s)
    - 1. Where each output size divides its input's, a mean over equal windows; else, per axis, a product with the
    windows' 0/1 matrix (made from iotas) divided by each window's length."""
    sizes = [output_size] if isinstance(output_size, int) else list(output_size)
    dims, lead = len(sizes), x.ndim - len(sizes)
    sizes = [x.shape[lead + d] if s is None else s for d, s in enumerate(sizes)]
    if dims > x.ndim or any(s <= 0 for s in sizes):
        raise ShapeError(f"adaptive_avg_pool to {tuple(sizes)}: output sizes must be positive, one per trailing"
                         f" axis of {x.shape}")
    if all(x.shape[lead + d] % s == 0 for d, s in enumerate(sizes)):
        split = x.shape[:lead] + tuple(n for d, s in enumerate(sizes) for n in (s, x.shape[lead + d] // s))
        return x.reshape(split).mean([lead + 2 * d + 1 for d in range(dims)])
    for d, s in enumerate(sizes):
        x = _unequal_windows_mean(x, lead + d, s)
    return x


def _unequal_windows_mean(x: Tensor, axis: int, s: int) -> Tensor:
    """`axis` pooled to `s` outputs as adaptive_avg_pool windows it: input i lies in output o's window where
    o n < (i + 1) s and i s < (o + 1) n (integers, no division)."""
    n = x.shape[axis]
    i, o = iota((n, s), 0), iota((n, s), 1)
    member = logical_and((o * n) < (i + 1) * s, (i * s) < (o + 1) * n)
    weights = member.cast(x.dtype if x.dtype.is_float else DType.FLOAT32)
    order = [a for a in range(x.ndim) if a != axis] + [axis]
    summed = x.permute(*order).cast(weights.dtype) @ weights / weights.sum(0)
    return summed.permute(*[order.index(a) for a in range(x.ndim)])


def _pooling(x: Tensor, kernel: Size, stride: Size | None, padding: Pads, dilation: Size, ceil_mode: bool,
             name: str) -> tuple[list[int], list[int], list[tuple[int, int]], list[int], list[int], list[int]]:
    """A pooling's sizes per axis, its (before, after) pads, its output's sizes, and how far ceil mode's last,
    partial window reaches past the padded input on each axis (0 without one)."""
    kernel = [kernel] if isinstance(kernel, int) else list(kernel)
    dims = len(kernel)
    if x.ndim < dims + 1:
        raise ShapeError(f"{name} over {dims} axes needs an input of at least {dims + 1}, got {x.shape}")
    stride = kernel if stride is None or (not isinstance(stride, int) and not list(stride)) else \
        _per_axis(stride, dims, "stride")
    pads, dilation = _pads(padding, dims), _per_axis(dilation, dims, "dilation")
    if any(2 * max(pad) > k for pad, k in zip(pads, kernel)):
        raise ShapeError(f"{name}: padding {padding} is more than half the kernel {kernel}")
    spatial = x.shape[x.ndim - dims:]
    out = _out_sizes(spatial, kernel, stride, pads, dilation, ceil=ceil_mode)
    overhang = [max(0, (o - 1) * st + d * (k - 1) + 1 - (n + before + after))
                for o, st, d, k, n, (before, after) in zip(out, stride, dilation, kernel, spatial, pads)]
    return kernel, stride, pads, dilation, out, overhang


def _pads(padding: Pads, dims: int) -> list[tuple[int, int]]:
    """Each axis's (before, after) padding: one number for all, one per axis, or a pair per axis."""
    if not isinstance(padding, int) and all(isinstance(p, (tuple, list)) for p in padding):
        pairs = [tuple(p) for p in padding]
        if len(pairs) != dims or any(len(p) != 2 or min(p) < 0 for p in pairs):
            raise ShapeError(f"padding {padding!r}: expected {dims} (before, after) pair(s)")
        return pairs   # type: ignore[return-value]
    return [(p, p) for p in _per_axis(padding, dims, "padding")]   # type: ignore[arg-type]


def _per_axis(value: Size, dims: int, name: str) -> list[int]:
    values = [value] * dims if isinstance(value, int) else list(value)
    if len(values) == 1:
        values = values * dims
    if len(values) != dims or any(not isinstance(v, int) or v < 0 for v in values):
        raise ShapeError(f"{name} {value!r}: expected {dims} non-negative integer(s)")
    return values


def _out_sizes(spatial: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
               pads: Sequence[tuple[int, int]], dilation: Sequence[int], ceil: bool = False) -> list[int]:
    out = []
    for n, k, s, (before, after), d in zip(spatial, kernel, stride, pads, dilation):
        reach = n + before + after - d * (k - 1) - 1
        if reach < 0 or s < 1:
            raise ShapeError(f"a window of {k} (dilation {d}, stride {s}) does not fit an axis of {n} padded by"
                             f" {(before, after)}")
        size = (-(-reach // s) if ceil else reach // s) + 1
        if ceil and (size - 1) * s >= n + before:   # PyTorch: the last window starts inside the input or its pad
            size -= 1
        out.append(size)
    return out


def _windows(x: Tensor, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int], out: Sequence[int],
             lead: int | None = None) -> list[Tensor]:
    """For each kernel offset (in row-major order), the strided view of `x` (already padded) it reads: x's leading
    axes, then `out`."""
    lead = x.ndim - len(kernel) if lead is None else lead
    views = []
    for offsets in _offsets(kernel):
        view = x
        for d, offset in enumerate(offsets):
            view = _strided(view, lead + d, offset * dilation[d], stride[d], out[d])
        views.append(view)
    return views


def _offsets(kernel: Sequence[int]) -> list[tuple[int, ...]]:
    offsets: list[tuple[int, ...]] = [()]
    for size in kernel:
        offsets = [o + (i,) for o in offsets for i in range(size)]
    return offsets


def _strided(x: Tensor, axis: int, start: int, step: int, count: int) -> Tensor:
    """x[..., start : start + step * count : step, ...] along `axis`, as slices and reshapes (zeros padded past the
    end where the last step's unread elements run over it)."""
    before = (slice(None),) * axis
    if step == 1:
        return x[before + (slice(start, start + count),)]
    end = start + step * count
    if end > x.shape[axis]:
        x = x.pad([(0, 0)] * axis + [(0, end - x.shape[axis])] + [(0, 0)] * (x.ndim - axis - 1))
    grouped = x[before + (slice(start, end),)]
    grouped = grouped.reshape(x.shape[:axis] + (count, step) + x.shape[axis + 1:])
    picked = grouped[before + (slice(None), slice(0, 1))]
    return picked.reshape(x.shape[:axis] + (count,) + x.shape[axis + 1:])


def _columns(x: Tensor, kernel: Sequence[int], stride: Sequence[int], pads: list[tuple[int, int]],
             dilation: Sequence[int], out: Sequence[int]) -> Tensor:
    """x's windows as (N, *out, C * taps), channel-major: a reshape and permute of x where they tile it, else
    gathered by slices from x padded."""
    n, c, dims = x.shape[0], x.shape[1], len(kernel)
    if list(stride) == list(kernel) and not any(b or e for b, e in pads) and all(d == 1 for d in dilation) and \
            all(o * k == s for o, k, s in zip(out, kernel, x.shape[2:])):
        split = x.reshape((n, c) + tuple(v for o, k in zip(out, kernel) for v in (o, k)))
        order = (0,) + tuple(2 + 2 * d for d in range(dims)) + (1,) + tuple(3 + 2 * d for d in range(dims))
        return split.permute(order).reshape((n, *out, c * math.prod(kernel)))
    windows = _windows(x.pad([(0, 0), (0, 0)] + pads), kernel, stride, dilation, out)
    stacked = concat([w.reshape(w.shape + (1,)) for w in windows], dims + 2)      # (N, C, *out, taps)
    order = (0,) + tuple(range(2, dims + 2)) + (1, dims + 2)
    return stacked.permute(order).reshape((n, *out, c * math.prod(kernel)))


def _summed(tensors) -> Tensor:
    return functools.reduce(lambda a, b: a + b, tensors)


def _lowest(dtype: DType) -> float:
    return -LARGEST_FINITE[dtype]
