"""Contractions: the laws of matrix products that change how much work a program does.

They rewrite `MatMul` terms (rewrites/patterns.py recognises them), so they run in their own stage after the
patterns. Each is proved in the "real" model over one output element: at every length, by induction on the
contracted length (and, for associativity, on the other one; rewrites/every_length.py), the prefix sums
uninterpreted functions; and, as before, over small concrete sizes with uninterpreted elements. The shapes are the
rule's: the 2-D products `a @ b` that `Tensor.__matmul__` builds, `MatMul(reshape(a, (m, k, 1)),
reshape(b, (1, k, n)), (m, k, n), 1)`.

- matmul_assoc: (a @ b) @ c -> a @ (b @ c), and back: which costs fewer FLOPs depends on the shapes
  (4096x64 @ 64x4096 @ 4096x64 is 64 times cheaper right-first).
- matmul_factor: a @ b + a @ c -> a @ (b + c), and a @ c + b @ c -> (a + b) @ c: one product instead of two.
- matmul_distribute: a @ (b + c) -> a @ b + a @ c: the reverse, so that a sum of weights can be read as two
  plain operands (TMA) rather than one computed one.
"""
from __future__ import annotations

from typing import Any

from egglog import Vec, i64, rewrite, var

from tensorsmith.ir.graph import Graph
from tensorsmith.ir.tensor import Tensor

from . import every_length
from .proofs import Claim
from .rule import Rule, tensor_example
from .term import Add, MatMul, Reshape, TExpr, dtype_of, shape_of

a, b, c = var("a", TExpr), var("b", TExpr), var("c", TExpr)
s, s1, s2 = var("s", Vec[i64]), var("s1", Vec[i64]), var("s2", Vec[i64])
ra, rb, rc, rab = var("ra", Vec[i64]), var("rb", Vec[i64]), var("rc", Vec[i64]), var("rab", Vec[i64])
axis = var("axis", i64)
ONE = i64(1)
K, N = 3, 2          # contraction lengths of the claims


def _v(*items: Any) -> Vec[i64]:
    return Vec[i64](*items)


def _mm(left: TExpr, right: TExpr, product: Vec[i64]) -> TExpr:
    return MatMul(left, right, product, ONE)


def _assoc_right() -> Any:
    """(a @ b) @ c -> a @ (b @ c): a (m, k), b (k, n), c (n, p)."""
    m, k, n, p = s1[i64(0)], s1[i64(1)], s1[i64(2)], s2[i64(2)]
    lhs = _mm(Reshape(_mm(Reshape(a, ra), Reshape(b, rb), s1), rab), Reshape(c, rc), s2)
    bc = _mm(Reshape(b, _v(k, n, ONE)), Reshape(c, rc), _v(k, n, p))
    rhs = _mm(Reshape(a, ra), Reshape(bc, _v(ONE, k, p)), _v(m, k, p))
    return rewrite(lhs).to(rhs, s1.length() == i64(3), s2.length() == i64(3), ra == _v(m, k, ONE),
                           rb == _v(ONE, k, n), rab == _v(m, n, ONE), rc == _v(ONE, n, p), s2 == _v(m, n, p))


def _assoc_left() -> Any:
    """a @ (b @ c) -> (a @ b) @ c: a (m, k), b (k, n), c (n, p)."""
    k, n, p, m = s1[i64(0)], s1[i64(1)], s1[i64(2)], s2[i64(0)]
    lhs = _mm(Reshape(a, ra), Reshape(_mm(Reshape(b, rb), Reshape(c, rc), s1), rab), s2)
    ab = _mm(Reshape(a, ra), Reshape(b, _v(ONE, k, n)), _v(m, k, n))
    rhs = _mm(Reshape(ab, _v(m, n, ONE)), Reshape(c, rc), _v(m, n, p))
    return rewrite(lhs).to(rhs, s1.length() == i64(3), s2.length() == i64(3), ra == _v(m, k, ONE),
                           rb == _v(k, n, ONE), rc == _v(ONE, n, p), rab == _v(ONE, k, p), s2 == _v(m, k, p))


def _dot(u: list[Any], v: list[Any]) -> Any:
    """A contraction of one output element: the products summed in order, as Sum computes them."""
    total = u[0] * v[0]
    for left, right in zip(u[1:], v[1:]):
        total = total + left * right
    return total


def _assoc_claim() -> Claim:
    """Row a (K), matrix b (K x N), column c (N): sum_n (sum_k a_k b_kn) c_n = sum_k a_k (sum_n b_kn c_n)."""
    def split(v: tuple) -> tuple[list, list[list], list]:
        row, flat, col = list(v[:K]), v[K:K + K * N], list(v[K + K * N:])
        return row, [list(flat[i * N:(i + 1) * N]) for i in range(K)], col

    def lhs(*v: Any) -> Any:
        row, mat, col = split(v)
        return _dot([_dot(row, [mat[i][j] for i in range(K)]) for j in range(N)], col)

    def rhs(*v: Any) -> Any:
        row, mat, col = split(v)
        return _dot(row, [_dot(mat[i], col) for i in range(K)])
    return Claim(lhs, rhs, sorts=("real",) * (K + K * N + N), note=f"{K} x {N}")


def _factor_claim() -> Claim:
    """sum_k a_k b_k + sum_k a_k c_k = sum_k a_k (b_k + c_k) (either side's operand shared)."""
    return Claim(lambda *v: _dot(list(v[:K]), list(v[K:2 * K])) + _dot(list(v[:K]), list(v[2 * K:])),
                 lambda *v: _dot(list(v[:K]), [u + w for u, w in zip(v[K:2 * K], v[2 * K:])]),
                 sorts=("real",) * (3 * K), note=f"length {K}")


def _distribute_claim() -> Claim:
    return Claim(lambda *v: _dot(list(v[:K]), [u + w for u, w in zip(v[K:2 * K], v[2 * K:])]),
                 lambda *v: _dot(list(v[:K]), list(v[K:2 * K])) + _dot(list(v[:K]), list(v[2 * K:])),
                 sorts=("real",) * (3 * K), note=f"length {K}")


def _inputs(g: Graph, *shapes: tuple[int, int]) -> list[Tensor]:
    return [g.input(name, shape, "float32") for name, shape in zip("abcd", shapes)]


def _chain_right(g: Graph) -> Tensor:
    a_, b_, c_ = _inputs(g, (3, 4), (4, 5), (5, 2))
    return (a_ @ b_) @ c_


def _chain_left(g: Graph) -> Tensor:
    a_, b_, c_ = _inputs(g, (3, 4), (4, 5), (5, 2))
    return a_ @ (b_ @ c_)


def _shared_left(g: Graph) -> Tensor:
    a_, b_, c_ = _inputs(g, (3, 4), (4, 5), (4, 5))
    return a_ @ b_ + a_ @ c_


def _summed_weight(g: Graph) -> Tensor:
    a_, b_, c_ = _inputs(g, (3, 4), (4, 5), (4, 5))
    return a_ @ (b_ + c_)


CONTRACTIONS: tuple[Rule, ...] = (
    Rule("matmul_assoc", "(a @ b) @ c -> a @ (b @ c)", (_assoc_right(),),
         (_assoc_claim(), *every_length.contraction_assoc()),
         tensor_example("matmul_assoc", _chain_right), model="real", stage="contractions"),
    Rule("matmul_assoc_left", "a @ (b @ c) -> (a @ b) @ c",
         (_assoc_left(),), (_assoc_claim(), *every_length.contraction_assoc()),
         tensor_example("matmul_assoc_left", _chain_left), model="real", stage="contractions"),
    Rule("matmul_factor", "a @ b + a @ c -> a @ (b + c); a @ c + b @ c -> (a + b) @ c",
         (rewrite(Add(MatMul(a, b, s, axis), MatMul(a, c, s, axis))).to(
             MatMul(a, Add(b, c), s, axis), shape_of(b) == shape_of(c), dtype_of(b) == dtype_of(c)),
          rewrite(Add(MatMul(a, c, s, axis), MatMul(b, c, s, axis))).to(
             MatMul(Add(a, b), c, s, axis), shape_of(a) == shape_of(b), dtype_of(a) == dtype_of(b))),
         (_factor_claim(), *every_length.contraction_factor()), tensor_example("matmul_factor", _shared_left),
         model="real", stage="contractions"),
    Rule("matmul_distribute", "a @ (b + c) -> a @ b + a @ c (the summed operand possibly reshaped)",
         (rewrite(MatMul(a, Add(b, c), s, axis)).to(Add(MatMul(a, b, s, axis), MatMul(a, c, s, axis))),
          rewrite(MatMul(a, Reshape(Add(b, c), rb), s, axis)).to(
              Add(MatMul(a, Reshape(b, rb), s, axis), MatMul(a, Reshape(c, rb), s, axis)))),
         (_distribute_claim(), *every_length.contraction_factor()),
         tensor_example("matmul_distribute", _summed_weight), model="real", stage="contractions"),
)
