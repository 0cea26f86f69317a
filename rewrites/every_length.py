"""The laws of sums and contractions proved at every length, by induction (rewrites/induction.py).

Elements are uninterpreted functions of their indices (x(k), b(k, j)); a sum of length n is a prefix-sum function
S with S(0) = 0 and S(m + 1) = S(m) + term(m). Each law gives its claims: the base case and the step of every
induction it takes, lemmas included. Names of the functions are prefixed by the law, so that no two laws share one.

- sum_factor: sum_k x_k c = (sum_k x_k) c, one induction.
- contraction_factor: sum_k a_k b_k + sum_k a_k c_k = sum_k a_k (b_k + c_k) (matmul_factor and, read the other
  way, matmul_distribute: each output element is this law over the contracted axis).
- row_scale: sum_k (x_k s) y_k = (sum_k x_k y_k) s, and with a weight w_k inside (rmsnorm_matmul).
- weight_scale: sum_k x_k (w_k c) = (sum_k x_k w_k) c (matmul_scaled_weight).
- sum_sum: sum_r sum_k x(r, k) = sum_k sum_r x(r, k) for every R x C: induction on R with C free, by two lemmas,
  each an induction on C (a sum of zeros is zero; adding a row to every column sum adds the row's sum).
- contraction_assoc: sum_j (sum_k a_k b(k, j)) c_j = sum_k a_k (sum_j b(k, j) c_j) for every K x J, the same way.
"""
from __future__ import annotations

import z3

from .induction import Induction, reals_of_index
from .proofs import Claim


def _claims(*inductions: Induction) -> tuple[Claim, ...]:
    return tuple(claim for induction in inductions for claim in induction.claims())


def sum_factor() -> tuple[Claim, ...]:
    """sum(x * c) = sum(x) * c for c constant along the summed axis."""
    x, sum_x, sum_xc = (reals_of_index(f"sum_factor_{name}") for name in ("x", "sum_x", "sum_xc"))
    c = z3.Real("sum_factor_c")
    return _claims(Induction(
        "sum(x * c) = sum(x) * c",
        holds=lambda n: sum_xc(n) == sum_x(n) * c,
        starts=lambda: [sum_x(0) == 0, sum_xc(0) == 0],
        steps=lambda n: [sum_x(n + 1) == sum_x(n) + x(n), sum_xc(n + 1) == sum_xc(n) + x(n) * c]))


def contraction_factor() -> tuple[Claim, ...]:
    """a . b + a . c = a . (b + c), over one output element's contracted axis."""
    a, b, c, ab, ac, abc = (reals_of_index(f"contraction_factor_{name}")
                            for name in ("a", "b", "c", "ab", "ac", "a_bc"))
    return _claims(Induction(
        "a.b + a.c = a.(b + c)",
        holds=lambda n: ab(n) + ac(n) == abc(n),
        starts=lambda: [ab(0) == 0, ac(0) == 0, abc(0) == 0],
        steps=lambda n: [ab(n + 1) == ab(n) + a(n) * b(n), ac(n + 1) == ac(n) + a(n) * c(n),
                         abc(n + 1) == abc(n) + a(n) * (b(n) + c(n))]))


def row_scale() -> tuple[Claim, ...]:
    """sum((x * s) * y) = sum(x * y) * s, and sum(((x * s) * w) * y) = sum((x * w) * y) * s."""
    x, y, w, xsy, xy, xswy, xwy = (reals_of_index(f"row_scale_{name}")
                                   for name in ("x", "y", "w", "xsy", "xy", "xswy", "xwy"))
    s = z3.Real("row_scale_s")
    plain = Induction(
        "sum((x*s)*y) = sum(x*y)*s",
        holds=lambda n: xsy(n) == xy(n) * s,
        starts=lambda: [xsy(0) == 0, xy(0) == 0],
        steps=lambda n: [xsy(n + 1) == xsy(n) + (x(n) * s) * y(n), xy(n + 1) == xy(n) + x(n) * y(n)])
    weighted = Induction(
        "sum(((x*s)*w)*y) = sum((x*w)*y)*s",
        holds=lambda n: xswy(n) == xwy(n) * s,
        starts=lambda: [xswy(0) == 0, xwy(0) == 0],
        steps=lambda n: [xswy(n + 1) == xswy(n) + ((x(n) * s) * w(n)) * y(n),
                         xwy(n + 1) == xwy(n) + (x(n) * w(n)) * y(n)])
    return _claims(plain, weighted)


def weight_scale() -> tuple[Claim, ...]:
    """sum(x * (w * c)) = sum(x * w) * c: a constant scale on a weight leaves the contraction."""
    x, w, xwc, xw = (reals_of_index(f"weight_scale_{name}") for name in ("x", "w", "xwc", "xw"))
    c = z3.Real("weight_scale_c")
    return _claims(Induction(
        "sum(x*(w*c)) = sum(x*w)*c",
        holds=lambda n: xwc(n) == xw(n) * c,
        starts=lambda: [xwc(0) == 0, xw(0) == 0],
        steps=lambda n: [xwc(n + 1) == xwc(n) + x(n) * (w(n) * c), xw(n + 1) == xw(n) + x(n) * w(n)]))


def sum_sum() -> tuple[Claim, ...]:
    """Rows first or columns first: rows_total(R, C) = sum_{r<R} row(r, C), row(r, m) = sum_{k<m} x(r, k);
    columns_total(R, m) = sum_{k<m} column(k, R), column(k, m) = sum_{r<m} x(r, k)."""
    x = reals_of_index("sum_sum_x", 2)
    row, column, rows_total, columns_total = (reals_of_index(f"sum_sum_{name}", 2)
                                              for name in ("row", "column", "rows_total", "columns_total"))
    no_rows = Induction(   # columns_total(0, m) = 0: every column sum over no rows is 0
        "lemma: a sum of empty column sums is 0",
        holds=lambda m: columns_total(0, m) == 0,
        starts=lambda: [columns_total(0, 0) == 0],
        steps=lambda m: [columns_total(0, m + 1) == columns_total(0, m) + column(m, 0), column(m, 0) == 0])
    one_more_row = Induction(   # induction on m, the row r free
        "lemma: adding row r to every column sum adds row r's sum",
        holds=lambda m, r: columns_total(r + 1, m) == columns_total(r, m) + row(r, m),
        starts=lambda r: [columns_total(r + 1, 0) == 0, columns_total(r, 0) == 0, row(r, 0) == 0],
        steps=lambda m, r: [columns_total(r + 1, m + 1) == columns_total(r + 1, m) + column(m, r + 1),
                            columns_total(r, m + 1) == columns_total(r, m) + column(m, r),
                            row(r, m + 1) == row(r, m) + x(r, m),
                            column(m, r + 1) == column(m, r) + x(r, m)],
        others=1)
    main = Induction(   # induction on the rows R, the columns C free
        "rows then columns = columns then rows",
        holds=lambda rows, cols: rows_total(rows, cols) == columns_total(rows, cols),
        starts=lambda cols: [rows_total(0, cols) == 0],
        steps=lambda rows, cols: [rows_total(rows + 1, cols) == rows_total(rows, cols) + row(rows, cols)],
        lemmas=((no_rows, lambda rows, cols: (cols,)), (one_more_row, lambda rows, cols: (cols, rows))),
        others=1)
    return _claims(no_rows, one_more_row, main)


def contraction_assoc() -> tuple[Claim, ...]:
    """(a @ b) @ c = a @ (b @ c) for one output element: a row a (K), b (K x J), a column c (J).
    left(J, K) = sum_{j<J} ab(j, K) c_j, ab(j, m) = sum_{k<m} a_k b(k, j);
    right(J, m) = sum_{k<m} a_k bc(k, J), bc(k, m) = sum_{j<m} b(k, j) c_j."""
    a, c = reals_of_index("contraction_assoc_a"), reals_of_index("contraction_assoc_c")
    b, ab, bc, left, right = (reals_of_index(f"contraction_assoc_{name}", 2)
                              for name in ("b", "ab", "bc", "left", "right"))
    no_columns = Induction(   # right(0, m) = 0: b @ c over no columns is 0
        "lemma: a over empty products is 0",
        holds=lambda m: right(0, m) == 0,
        starts=lambda: [right(0, 0) == 0],
        steps=lambda m: [right(0, m + 1) == right(0, m) + a(m) * bc(m, 0), bc(m, 0) == 0])
    one_more_column = Induction(   # induction on m, the column j free
        "lemma: adding column j adds c_j times a.b[:, j]",
        holds=lambda m, j: right(j + 1, m) == right(j, m) + c(j) * ab(j, m),
        starts=lambda j: [right(j + 1, 0) == 0, right(j, 0) == 0, ab(j, 0) == 0],
        steps=lambda m, j: [right(j + 1, m + 1) == right(j + 1, m) + a(m) * bc(m, j + 1),
                            right(j, m + 1) == right(j, m) + a(m) * bc(m, j),
                            bc(m, j + 1) == bc(m, j) + b(m, j) * c(j),
                            ab(j, m + 1) == ab(j, m) + a(m) * b(m, j)],
        others=1)
    main = Induction(   # induction on the columns J, the contracted length K free
        "(a.b).c = a.(b.c)",
        holds=lambda cols, k: left(cols, k) == right(cols, k),
        starts=lambda k: [left(0, k) == 0],
        steps=lambda cols, k: [left(cols + 1, k) == left(cols, k) + ab(cols, k) * c(cols)],
        lemmas=((no_columns, lambda cols, k: (k,)), (one_more_column, lambda cols, k: (k, cols))),
        others=1)
    return _claims(no_columns, one_more_column, main)
