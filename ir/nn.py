"""The nn library: every layer is a short composition of primitives, documented by its formula."""
from __future__ import annotations

import math

from collections.abc import Sequence

from .dtypes import LARGEST_FINITE, DType
from .errors import DTypeError, ShapeError, user_location
from .primitives import normalize_axis
from .tensor import Tensor, broadcast_shapes, concat, constant, equal, iota, matmul, maximum, where
from .windows import adaptive_avg_pool, avg_pool, conv, conv_transpose, max_pool

__all__ = ["relu", "sigmoid", "tanh", "gelu", "gelu_exact", "erf", "silu", "softmax", "log_softmax", "layer_norm",
           "rms_norm", "linear", "causal_mask", "attention", "rope", "matmul", "maximum", "minimum", "clamp", "power",
           "concat", "split", "embedding", "take", "index", "var", "std", "argmax", "argmin", "cumsum", "where", "constant", "iota",
           "conv", "conv_transpose", "max_pool", "avg_pool", "adaptive_avg_pool", "batch_norm", "topk", "put"]

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)  # the tanh form of GELU
GELU_CUBIC = 0.044715


def relu(x: Tensor) -> Tensor:
    """max(x, 0)."""
    return maximum(x, 0)


def sigmoid(x: Tensor) -> Tensor:
    """1 / (1 + e**-x)."""
    return (1 + (-x).exp()).recip()


def tanh(x: Tensor) -> Tensor:
    """tanh(x) = 2 * sigmoid(2x) - 1."""
    return 2 * sigmoid(2 * x) - 1


def gelu(x: Tensor) -> Tensor:
    """GELU, tanh form: x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x**3)))."""
    return 0.5 * x * (1 + tanh(SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x)))


def silu(x: Tensor) -> Tensor:
    """x * sigmoid(x)."""
    return x * sigmoid(x)


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """e**(x - max) / sum(e**(x - max)) along `axis`."""
    e = (x - x.max(axis, keepdim=True)).exp()
    return e / e.sum(axis, keepdim=True)


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """x - max - log(sum(e**(x - max))) along `axis`."""
    shifted = x - x.max(axis, keepdim=True)
    return shifted - shifted.exp().sum(axis, keepdim=True).log()


def layer_norm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis."""
    centered = x - x.mean(-1, keepdim=True)
    out = centered * ((centered * centered).mean(-1, keepdim=True) + eps).rsqrt()
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


def batch_norm(x: Tensor, mean: Tensor, var: Tensor, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """Batch normalisation as inference runs it: per channel (axis 1), with the running mean and variance given."""
    channel = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    out = (x - mean.reshape(channel)) * (var.reshape(channel) + eps).rsqrt()
    if weight is not None:
        out = out * weight.reshape(channel)
    if bias is not None:
        out = out + bias.reshape(channel)
    return out


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """x / sqrt(mean(x**2) + eps) * weight over the last axis."""
    out = x * ((x * x).mean(-1, keepdim=True) + eps).rsqrt()
    return out * weight if weight is not None else out


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x @ weight.T + bias, with weight of shape (out_features, in_features) as in PyTorch."""
    out = x @ weight.transpose(-1, -2)
    return out + bias if bias is not None else out


def causal_mask(q_len: int, k_len: int) -> Tensor:
    """True where query i may not see key j: j > i + (k_len - q_len)."""
    row = iota((q_len, k_len), axis=0)
    col = iota((q_len, k_len), axis=1)
    return row + (k_len - q_len) < col


def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, scale: float | None = None,
              bias: Tensor | None = None) -> Tensor:
    """softmax(q @ k^T * scale + bias + mask) @ v; the softmax runs in float32, masked scores are -1e9; `bias`
    (added in float32) broadcasts to the scores (..., q tokens, k tokens): a relative-position bias, a padding mask."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = ((q @ k.transpose(-1, -2)) * scale).cast("float32")
    if bias is not None:
        if bias.ndim > scores.ndim or any(b not in (1, s) for b, s in zip(bias.shape[::-1], scores.shape[::-1])):
            raise ShapeError(f"attention: a bias of shape {bias.shape} does not broadcast to the scores"
                             f" {scores.shape} at {user_location()}")
        scores = scores + bias.cast("float32")
    if causal:
        scores = scores + causal_mask(q.shape[-2], k.shape[-2]).cast("float32") * -1e9
    return softmax(scores, axis=-1).cast(v.dtype) @ v


def rope(x: Tensor, base: float = 10000.0) -> Tensor:
    """Rotary position embedding (computed in float32), rotate-half form, positions 0..T-1 along axis -2 of (..., T, D)."""
    if x.ndim < 2 or x.shape[-1] % 2:
        raise ShapeError(f"rope: needs (..., T, D) with D even, got {x.shape} at {user_location()}")
    seq, dim = x.shape[-2], x.shape[-1]
    half = dim // 2
    position = iota((seq, half), axis=0).cast("float32")
    inv_freq = (iota((seq, half), axis=1).cast("float32") * (-2.0 * math.log2(base) / dim)).exp2()
    angle = position * inv_freq
    cos, sin = angle.cos(), angle.sin()
    wide = x.cast("float32")
    x1, x2 = wide[..., :half], wide[..., half:]
    lead = [(0, 0)] * (x.ndim - 1)
    first = (x1 * cos - x2 * sin).pad(lead + [(0, half)])
    second = (x2 * cos + x1 * sin).pad(lead + [(half, 0)])
    return (first + second).cast(x.dtype)


ERF_P = 0.3275911                                     # Abramowitz and Stegun 7.1.26: |error| < 1.5e-7
ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def erf(x: Tensor) -> Tensor:
    """erf(x) = sign(x) (1 - t (a1 + t (a2 + ...)) e**-x**2), t = 1 / (1 + p |x|): within 1.5e-7 of erf
    (Abramowitz and Stegun 7.1.26)."""
    t = (1 + ERF_P * x.abs()).recip()
    poly = constant(ERF_A[-1], x.shape, x.dtype)
    for a in reversed(ERF_A[:-1]):
        poly = poly * t + a
    magnitude = 1 - poly * t * (-(x * x)).exp()
    return where(x < 0, -magnitude, magnitude)


def gelu_exact(x: Tensor) -> Tensor:
    """GELU as PyTorch's default computes it: x/2 * (1 + erf(x / sqrt(2)))."""
    return 0.5 * x * (1 + erf(x * (1 / math.sqrt(2.0))))


def minimum(a: Tensor | float, b: Tensor | float) -> Tensor:
    """Elementwise min, as -max(-a, -b)."""
    return -maximum(-a, -b)   # type: ignore[operator]


def clamp(x: Tensor, lo: float | None = None, hi: float | None = None) -> Tensor:
    """x limited to [lo, hi] (either bound may be left out)."""
    out = x if lo is None else maximum(x, lo)
    return out if hi is None else minimum(out, hi)


def power(x: Tensor, exponent: float) -> Tensor:
    """x ** exponent for a constant exponent: products for integers up to 8 (then any x), sqrt and rsqrt for +-1/2,
    else exp2(exponent * log2(x)), which needs x > 0."""
    e = float(exponent)
    if e == 0.5:
        return x.sqrt()
    if e == -0.5:
        return x.rsqrt()
    if e.is_integer() and abs(e) <= 8:
        out = constant(1.0, x.shape, x.dtype) if e == 0 else x
        for _ in range(int(abs(e)) - 1):
            out = out * x
        return out.recip() if e < 0 else out
    return (x.log2() * e).exp2()


def split(x: Tensor, sizes: Sequence[int], axis: int = 0) -> list[Tensor]:
    """x cut along `axis` into consecutive parts of the given sizes (views: they cost nothing)."""
    axis = normalize_axis(axis, x.ndim, "split", [x.node])
    if sum(sizes) != x.shape[axis]:
        raise ShapeError(f"split: sizes {list(sizes)} do not add up to axis {axis} of {x.shape} at {user_location()}")
    parts, start = [], 0
    for size in sizes:
        index = [slice(None)] * x.ndim
        index[axis] = slice(start, start + size)
        parts.append(x[tuple(index)])
        start += size
    return parts


def embedding(weight: Tensor, ids: Tensor) -> Tensor:
    """weight[ids]: rows of a (V, ...) table, as PyTorch's `nn.Embedding` (`take` along axis 0)."""
    return take(weight, ids, 0)


def take(x: Tensor, ids: Tensor, axis: int = 0, wrap: bool = False) -> Tensor:
    """x's slices at `ids` (int32) along `axis`, shaped x.shape[:axis] + ids.shape + x.shape[axis + 1:], as numpy's
    `take` and PyTorch's `index_select` (1-D ids) give them.

    Written as a one-hot sum, sum over r of (r == ids) * x[..., r, ...]: exact, the form the e-graph's rules and
    Z3 reason about; codegen reads the one slice it selects (`ir.patterns.match_gather`). A call with an id outside
    [0, n) is refused (InputError) where the ids are an input, as PyTorch refuses it; a computed id there gives zeros.
    With `wrap`, an id in [-n, 0) counts from the end, as numpy's, PyTorch's advanced indexing and ONNX's Gather
    count it (the ids are then computed, and not checked).
    """
    axis = normalize_axis(axis, x.ndim, "take", [x.node])
    if ids.dtype != DType.INT32:
        raise DTypeError(f"take: ids must be int32, got {ids.dtype} at {user_location()}")
    if x.dtype == DType.BOOL:      # a mask's entries, taken as numbers (a sum is no operation on bools)
        return take(x.cast(DType.INT32), ids, axis).cast(DType.BOOL)
    before, n, after = x.shape[:axis], x.shape[axis], x.shape[axis + 1:]
    if wrap:
        ids = where(ids < 0, ids + n, ids)
    space = before + ids.shape + (n,) + after       # the product's shape: the sum runs over its axis of n
    rows = len(before) + ids.ndim
    hot = equal(iota(ids.shape + (n,), ids.ndim), ids.reshape(ids.shape + (1,)).expand(ids.shape + (n,)))
    hot = hot.cast(x.dtype).reshape((1,) * len(before) + ids.shape + (n,) + (1,) * len(after)).expand(space)
    table = x.reshape(before + (1,) * ids.ndim + (n,) + after).expand(space)
    return (hot * table).sum(rows)


def index(x: Tensor, ids: Sequence[Tensor], axis: int = 0, wrap: bool = False) -> Tensor:
    """x[..., i, j, ...]: integer tensors of ids for the consecutive axes from `axis`, broadcast together, whose
    axes become one of their broadcast shape (PyTorch's advanced indexing on adjacent axes, ONNX's GatherND): a
    `take` along those axes flattened into one, at the ids' row-major offsets (an id out of its own axis's range
    but whose offset is in range reads another row). `wrap` as `take` has it, for each axis."""
    axis = normalize_axis(axis, x.ndim, "index", [x.node])
    sizes = x.shape[axis:axis + len(ids)]
    if not ids or len(sizes) != len(ids):
        raise ShapeError(f"index: {len(ids)} id tensors from axis {axis} of {x.shape} at {user_location()}")
    if len(ids) == 1:
        return take(x, ids[0], axis, wrap)
    if wrap:
        ids = [where(part < 0, part + size, part) for part, size in zip(ids, sizes)]
    shape: tuple[int, ...] = ()
    for part in ids:
        shape = broadcast_shapes(shape, part.shape, "index")
    offset = None
    for k, part in enumerate(ids):
        term = part.reshape((1,) * (len(shape) - part.ndim) + part.shape).expand(shape) * math.prod(sizes[k + 1:])
        offset = term if offset is None else offset + term
    assert offset is not None
    flat = x.reshape(x.shape[:axis] + (math.prod(sizes),) + x.shape[axis + len(ids):])
    return take(flat, offset, axis)


FEW_PUTS = 4   # ids up to which put() is a chain of where()s rather than a one-hot product


def put(x: Tensor, ids: Tensor, values: Tensor, axis: int = 0, wrap: bool = False) -> Tensor:
    """x with x[..., ids[j], ...] = values[..., j, ...] along `axis` (1-D int32 ids; PyTorch's index_put and
    index_copy, a KV cache written at its positions): for a few ids (a decode step's one) a where() per id, one
    elementwise pass; for more a one-hot product places the values and a mask keeps x where no id points. Of ids
    given twice the last one's value is kept, or, past FEW_PUTS ids, the values add up (PyTorch leaves that case
    undefined). `wrap` as `take` has it."""
    axis = normalize_axis(axis, x.ndim, "put", [x.node])
    n = x.shape[axis]
    if ids.ndim != 1 or ids.dtype != DType.INT32:
        raise ShapeError(f"put: ids must be 1-D int32, got {ids.shape} {ids.dtype} at {user_location()}")
    target = x.shape[:axis] + ids.shape + x.shape[axis + 1:]
    values = values.expand(broadcast_shapes(values.shape, target, "put")).cast(x.dtype)
    if wrap:
        ids = where(ids < 0, ids + n, ids)
    if ids.shape[0] <= FEW_PUTS:   # a decode step's one position: elementwise, one where() per id (the last wins)
        index = iota(x.shape, axis)
        out = x
        for j in range(ids.shape[0]):
            at = ids[j:j + 1].reshape((1,) * x.ndim).expand(x.shape)
            value = values[tuple(slice(j, j + 1) if a == axis else slice(None) for a in range(x.ndim))]
            out = where(equal(index, at), value.expand(x.shape), out)
        return out
    hot = equal(iota((n, ids.shape[0]), 0), ids.reshape(1, -1).expand((n, ids.shape[0])))      # (n, len(ids))
    last = [a for a in range(x.ndim) if a != axis] + [axis]
    placed = matmul(values.permute(*last), hot.cast(x.dtype).transpose(0, 1))    # the axis last, placed at the ids
    back = [last.index(a) for a in range(x.ndim)]
    covered = hot.cast("int32").max(1).cast(DType.BOOL).reshape((1,) * axis + (n,) + (1,) * (x.ndim - axis - 1))
    return where(covered.expand(x.shape), placed.permute(*back), x)


def var(x: Tensor, axis: int = -1, correction: int = 1, keepdim: bool = False) -> Tensor:
    """mean((x - mean(x))**2) * n / (n - correction) along `axis` (correction 1: the unbiased estimate, PyTorch's
    default)."""
    n = x.shape[normalize_axis(axis, x.ndim, "var", [x.node])]
    centered = x - x.mean(axis, keepdim=True)
    scale = 1.0 / (n - correction) if n > correction else math.inf   # no degrees of freedom left: nan, as PyTorch
    return (centered * centered).sum(axis, keepdim=keepdim) * scale


def std(x: Tensor, axis: int = -1, correction: int = 1, keepdim: bool = False) -> Tensor:
    """sqrt(var(x))."""
    return var(x, axis, correction, keepdim).sqrt()


def argmax(x: Tensor, axis: int = -1, keepdim: bool = False) -> Tensor:
    """The first index of the largest value along `axis`, as int32: the least index where x equals its max."""
    return _first_index(x, x.max(axis, keepdim=True), axis, keepdim)


def argmin(x: Tensor, axis: int = -1, keepdim: bool = False) -> Tensor:
    """The first index of the smallest value along `axis`, as int32."""
    return _first_index(x, -((-x).max(axis, keepdim=True)), axis, keepdim)


def topk(x: Tensor, k: int, axis: int = -1, largest: bool = True) -> tuple[Tensor, Tensor]:
    """The k largest (or smallest) values along `axis`, largest first (smallest first), and their indices as int32
    (of equal values, the lesser index first, as argmax takes them): k rounds of a max, each taking the first index
    of its value out of the next. Work grows with k: for the small k of routing (2 of 8 experts), not a sort."""
    axis = normalize_axis(axis, x.ndim, "topk", [x.node])
    n = x.shape[axis]
    if not isinstance(k, int) or not 1 <= k <= n:
        raise ShapeError(f"topk: k = {k!r} must be between 1 and the axis' size {n} at {user_location()}")
    rest = x if largest else -x
    taken = LARGEST_FINITE.get(x.dtype, 2 ** 31 - 1)   # a finite stand-in for -inf: where() blends both sides
    index = iota(x.shape, axis).cast("float32")
    values, indices = [], []
    for _ in range(k):
        top = rest.max(axis, keepdim=True)
        first = -((-where(equal(rest, top.expand(x.shape)), index, float(n))).max(axis, keepdim=True))
        values.append(top)
        indices.append(first)
        rest = where(equal(index, first.expand(x.shape)), -taken, rest)
    chosen = concat(values, axis)
    return chosen if largest else -chosen, concat(indices, axis).cast("int32")


def _first_index(x: Tensor, extreme: Tensor, axis: int, keepdim: bool) -> Tensor:
    axis = normalize_axis(axis, x.ndim, "argmax", [x.node])
    n = x.shape[axis]
    index = iota(x.shape, axis).cast("float32")
    candidates = where(equal(x, extreme.expand(x.shape)), index, float(n))   # n where x is not the extreme
    return (-((-candidates).max(axis, keepdim=keepdim))).cast("int32")


def cumsum(x: Tensor, axis: int = -1) -> Tensor:
    """Running sums along `axis`, as x @ a lower-triangular matrix of ones (made from iotas): n**2 work along the axis,
    for the short axes models run them on (positions, masks)."""
    axis = normalize_axis(axis, x.ndim, "cumsum", [x.node])
    n = x.shape[axis]
    moved = x if axis == x.ndim - 1 else x.transpose(axis, -1)
    upto = (iota((n, n), 0) < iota((n, n), 1) + 1).cast(x.dtype)        # upto[j, i] = j <= i
    out = moved @ upto
    return out if axis == x.ndim - 1 else out.transpose(axis, -1)
