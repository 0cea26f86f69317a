"""Every rule is proved by Z3 and agrees with the reference interpreter; unsound rules are caught by both."""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterator

import numpy as np
import pytest
import z3
from egglog import String, Vec, i64, rewrite, var

import tensorsmith as ts
from tensorsmith.ir import primitives as P
from tensorsmith.ir.ops import Op
from tensorsmith.rewrites import CLAIMS, RULES, Claim, Rule, Verdict, check, saturate
from tensorsmith.ir.tensor import LOG2_E
from tensorsmith.rewrites.eclasses import (PATTERN_OPS, EClasses, ENode, build_graph, cheapest, encode_value,
                                           read_eclasses)
from tensorsmith.rewrites import every_length
from tensorsmith.rewrites.induction import SOME_LARGE_LENGTH, Induction, reals_of_index
from tensorsmith.rewrites.logarithms import log2_product_instances
from tensorsmith.rewrites.proofs import (FIN, LOG2, MAX_FINITE, Scalar, consistent, exp2, log2, permute_source, recip,
                                         reshape_source, sqrt)
from tensorsmith.rewrites.term import Const, Mul, TExpr, constructor_cost

SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -3e38, 65504.0])
IDS = [rule.name for rule in RULES]


# Z3 ----------------------------------------------------------------------------------------------

def test_rule_names_are_unique_and_every_rule_has_claims() -> None:
    assert len(set(IDS)) == len(IDS)
    assert set(CLAIMS) == set(IDS)
    missing = [rule.name for rule in RULES if not rule.claims]
    assert not missing, f"rules without a proof obligation: {missing}"


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_every_rule_states_the_model_its_claims_are_proved_in(rule: Rule) -> None:
    models = {claim.model for claim in rule.claims}
    index = all(claim.sorts is not None and set(claim.sorts) <= {"int", "bool"} and not claim.real
                for claim in rule.claims)
    expected = "real" if "real" in models else "index" if index else "ieee"
    assert rule.model == expected, f"{rule.name} is marked {rule.model!r} but its claims are proved in {expected!r}"


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_z3_proves_every_claim_of_the_rule(rule: Rule) -> None:
    assert rule.claims, f"{rule.name} has no proof obligation"
    for claim in rule.claims:
        verdict, model = check(claim)
        assert verdict == Verdict.PROVED, f"{rule.name} {claim.note}: {verdict.value}, counterexample {model}"


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_the_premises_of_every_claim_can_hold(rule: Rule) -> None:
    for claim in rule.claims:
        assert consistent(claim), f"{rule.name} {claim.note}: the premises are contradictory, the proof is vacuous"


ZERO = Scalar.const(0.0)
UNSOUND = {
    "mul_zero": Claim(lambda x: x * 0.0, lambda x: ZERO),                     # inf * 0 is nan
    "exp2_log2": Claim(lambda x: exp2(log2(x)), lambda x: x),                # x <= 0
    "recip_recip": Claim(lambda x: recip(recip(x)), lambda x: x),            # 1/x overflows for tiny x
    "recip_recip_nonzero": Claim(lambda x: recip(recip(x)), lambda x: x, assuming=lambda x: x.value != 0),
    "sqrt_square": Claim(lambda x: sqrt(x * x), lambda x: x),                # x < 0
    "add_assoc": Claim(lambda a, b, c: (a + b) + c, lambda a, b, c: a + (b + c)),  # overflow: the real model's
    "sum_factor_ieee": Claim(lambda a, b, c: a * c + b * c, lambda a, b, c: (a + b) * c),  # 0 * inf + 1 * inf
    "recip_mul_no_premise": Claim(lambda a, b: (1 / a) * (1 / b), lambda a, b: 1 / (a * b), sorts=("real", "real"),
                                  assuming=lambda a, b: a != 0),   # b = 0: Z3's 1/0 is any value
    "add_cancel": Claim(lambda x: x + -1.0 * x, lambda x: ZERO),              # inf - inf
    # log2: a product's log without the positivity of its factors (-1 * -1), and log2(exp2(x)) on floats (overflow)
    "log2_product_any_sign": Claim(lambda u, v: LOG2(u * v), lambda u, v: LOG2(u) + LOG2(v), sorts=("real", "real"),
                                   assuming=lambda u, v: z3.And(*log2_product_instances(u, v))),
    "log2_exp2_ieee": Claim(lambda x: log2(exp2(x)), lambda x: x),
    # views: composing permutations in the wrong order, and a reshape taken for a transpose
    "permute_wrong_order": Claim(lambda *i: permute_source(permute_source(i, (1, 0, 2)), (1, 2, 0)),
                                 lambda *i: permute_source(i, (0, 2, 1)), sorts=("int",) * 3),
    "reshape_is_not_transpose": Claim(lambda i, j: reshape_source((i, j), (2, 3), (3, 2)), lambda i, j: (j, i),
                                      assuming=lambda i, j: z3.And(0 <= i, i < 3, 0 <= j, j < 2), sorts=("int", "int")),
}


@pytest.mark.parametrize("name", list(UNSOUND))
def test_unsound_claims_are_not_proved(name: str) -> None:
    verdict, _ = check(UNSOUND[name], timeout_ms=2000)
    assert verdict != Verdict.PROVED


def test_the_obvious_counterexamples_are_found() -> None:
    assert check(UNSOUND["mul_zero"])[0] == Verdict.REFUTED
    assert check(UNSOUND["exp2_log2"])[0] == Verdict.REFUTED
    assert check(UNSOUND["permute_wrong_order"])[0] == Verdict.REFUTED


def test_the_narrower_claims_of_the_unsound_ones_do_hold() -> None:
    """The machinery is not merely refusing: with the missing premise stated, the same laws are proved."""
    def positive(x: Scalar) -> z3.BoolRef:
        return z3.And(x.kind == FIN, x.value > 0)

    assert check(Claim(lambda x: exp2(log2(x)), lambda x: x, assuming=positive))[0] == Verdict.PROVED
    # x * x overflows for x > sqrt(MAX_FINITE): the model knows, so the claim must say so
    assert check(Claim(lambda x: sqrt(x * x), lambda x: x, assuming=positive))[0] == Verdict.REFUTED
    small = Claim(lambda x: sqrt(x * x), lambda x: x,
                  assuming=lambda x: z3.And(positive(x), x.value * x.value <= MAX_FINITE))
    assert check(small)[0] == Verdict.PROVED


# lengths: which reduction rules are proved at every length, and why the others are not ---------------------

REDUCTION_CONSTRUCTORS = ("Sum(", "Max(", "MatMul(", "OnlineSoftmax(")
PROVED_AT_EVERY_LENGTH = {"sum_sum", "sum_factor", "rmsnorm_matmul", "matmul_scaled_weight", "matmul_assoc",
                          "matmul_assoc_left", "matmul_factor", "matmul_distribute"}
REDUCTION_RULES = [rule for rule in RULES
                   if any(name in str(r) for r in rule.rewrites for name in REDUCTION_CONSTRUCTORS)
                   or rule.bounded_because]


def length_claims(rule: Rule) -> list[Claim]:
    """The claims of the rule's inductions that leave a length free (every step, and the bases of two-length laws)."""
    return [claim for claim in rule.claims if claim.lengths]


def test_the_rules_proved_at_every_length_are_these() -> None:
    """The report: proved over symbolic lengths, or at fixed lengths with the reason. A rule moved from the first
    to the second (its induction dropped) fails here."""
    symbolic = {rule.name for rule in RULES if length_claims(rule)}
    bounded = {rule.name: rule.bounded_because for rule in REDUCTION_RULES if rule.name not in symbolic}
    report = "\n".join([f"every length: {sorted(symbolic)}"]
                       + [f"fixed lengths: {name}: {why}" for name, why in bounded.items()])
    assert symbolic == PROVED_AT_EVERY_LENGTH, report
    assert all(bounded.values()), report


@pytest.mark.parametrize("rule", REDUCTION_RULES, ids=[rule.name for rule in REDUCTION_RULES])
def test_a_reduction_rule_is_proved_at_every_length_or_says_why_not(rule: Rule) -> None:
    assert bool(length_claims(rule)) != bool(rule.bounded_because), \
        f"{rule.name}: proved at every length and also bounded, or neither"


@pytest.mark.parametrize("name", sorted(PROVED_AT_EVERY_LENGTH))
def test_a_symbolic_proof_has_no_bound_on_its_lengths(name: str) -> None:
    """Every base case has its step; each claim that leaves a length free is proved, and its premises hold with
    every free length at 10**6 (a bound hidden in a premise, such as n <= 3, would make them contradictory)."""
    rule = next(rule for rule in RULES if rule.name == name)
    notes = [claim.note for claim in rule.claims]
    bases, steps = sum("base case" in n for n in notes), sum("step, length n -> n + 1" in n for n in notes)
    assert bases == steps >= 1, notes
    for claim in length_claims(rule):
        assert check(claim)[0] == Verdict.PROVED, claim.note
        assert claim.sorts is not None and all(claim.sorts[i] == "int" for i in claim.lengths)
        premises = claim.assuming
        assert premises is not None

        def large(*v: z3.ArithRef, premises: Callable = premises, claim: Claim = claim) -> z3.BoolRef:
            return z3.And(premises(*v), *[v[i] == SOME_LARGE_LENGTH + i for i in claim.lengths])
        assert consistent(dataclasses.replace(claim, assuming=large)), f"{claim.note}: a bound hides in the premises"


def test_a_wrong_law_fails_its_induction_step() -> None:
    """sum(x * c) = sum(x) is refuted at the step, and the double sum's main step is not proved without its lemmas;
    a lemma is assumed as its own statement, which its own claims must prove (a circular one is refuted)."""
    x, sum_x, sum_xc = (reals_of_index(f"wrong_{name}") for name in ("x", "sum_x", "sum_xc"))
    c = z3.Real("wrong_c")
    wrong = Induction("sum(x * c) = sum(x)", holds=lambda n: sum_xc(n) == sum_x(n),
                      starts=lambda: [sum_x(0) == 0, sum_xc(0) == 0],
                      steps=lambda n: [sum_x(n + 1) == sum_x(n) + x(n), sum_xc(n + 1) == sum_xc(n) + x(n) * c])
    base, step = wrong.claims()
    assert check(base)[0] == Verdict.PROVED and check(step)[0] == Verdict.REFUTED
    assert all(check(claim)[0] == Verdict.PROVED for claim in every_length.sum_sum())
    rows_total, columns_total, row = (reals_of_index(f"sum_sum_{name}", 2)
                                      for name in ("rows_total", "columns_total", "row"))
    without_lemmas = Induction(
        "rows then columns = columns then rows, no lemmas",
        holds=lambda rows, cols: rows_total(rows, cols) == columns_total(rows, cols),
        starts=lambda cols: [rows_total(0, cols) == 0],
        steps=lambda rows, cols: [rows_total(rows + 1, cols) == rows_total(rows, cols) + row(rows, cols)], others=1)
    assert all(check(claim)[0] != Verdict.PROVED for claim in without_lemmas.claims())
    circular = Induction(   # the goal stated as a lemma: a step assuming it proves anything, but it is no lemma
        "circular", holds=lambda m, r: columns_total(r + 1, m) == rows_total(r + 1, m),
        starts=lambda r: [], steps=lambda m, r: [], others=1)
    leaning = dataclasses.replace(without_lemmas, lemmas=((circular, lambda rows, cols: (cols, rows)),))
    assert check(leaning.claims()[1])[0] == Verdict.PROVED      # the step alone would pass on it ...
    assert not all(check(claim)[0] == Verdict.PROVED for claim in circular.claims())   # ... its lemma is refuted


# numbers -----------------------------------------------------------------------------------------

def random_inputs(graph: ts.Graph, seed: int) -> dict[str, np.ndarray]:
    """Normal values with IEEE special values sprinkled in (floats), small ints, or bools."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, node in graph.inputs.items():
        if node.dtype == ts.DType.INT32:
            arrays[name] = rng.integers(-9, 10, node.shape).astype(np.int32)
        elif node.dtype == ts.DType.BOOL:
            arrays[name] = rng.random(node.shape) < 0.5
        else:
            values = rng.standard_normal(node.shape) * 10
            flat = values.reshape(-1)
            picks = rng.random(flat.size) < 0.3
            flat[picks] = rng.choice(SPECIALS, picks.sum())
            arrays[name] = values.astype(np.float32)
    return arrays


def finite_inputs(graph: ts.Graph, seed: int) -> dict[str, np.ndarray]:
    """Finite normal values away from zero (the "real" model's rules hold on finite values, up to rounding)."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, node in graph.inputs.items():
        values = rng.standard_normal(node.shape) * 4
        arrays[name] = (values + np.sign(values) * 0.25).astype(np.float32)
    return arrays


def pattern_value(enode: ENode, args: list[np.ndarray]) -> np.ndarray:
    """numpy semantics of the pattern nodes, for the numeric check (they have no Node to evaluate)."""
    if enode.op == "MatMul":
        shape, axis = enode.lits
        with np.errstate(all="ignore"):
            return (np.broadcast_to(args[0], shape) * np.broadcast_to(args[1], shape)).sum(axis=axis)
    assert enode.op == "OnlineSoftmax", enode.op
    axis, block = enode.lits
    x = np.moveaxis(args[0], axis, -1)
    top, total = np.full(x.shape[:-1], -np.inf), np.zeros(x.shape[:-1])
    for start in range(0, x.shape[-1], block):      # the streaming algorithm, block by block
        chunk = x[..., start:start + block]
        new_top = np.maximum(top, chunk.max(axis=-1))
        total = total * np.exp2((top - new_top) * LOG2_E) + np.exp2((chunk - new_top[..., None]) * LOG2_E).sum(-1)
        top = new_top
    return np.moveaxis(np.exp2((x - top[..., None]) * LOG2_E) / total[..., None], -1, axis)


def root_alternatives(classes: EClasses, graph: ts.Graph) -> Iterator[tuple[str, Callable[[dict], dict]]]:
    """For every output and every e-node in its root e-class: a function of the inputs that evaluates the graph
    with that e-node at the root (pattern nodes by their numpy semantics)."""
    choice = cheapest(classes, constructor_cost)
    fresh = max(classes.nodes) + 1
    for name, root in classes.roots.items():
        for enode in classes.nodes[root]:
            if enode.op in PATTERN_OPS:
                kids = EClasses(classes.nodes, {f"k{i}": c for i, c in enumerate(enode.children)}, classes.shapes,
                                classes.dtypes)
                sub = build_graph(kids, choice, graph)

                def run(inputs: dict, sub: ts.Graph = sub, enode: ENode = enode, name: str = name) -> dict:
                    values = ts.evaluate(sub, inputs)
                    return {name: pattern_value(enode, [values[f"k{i}"] for i in range(len(enode.children))])}
                yield enode.op, run
                continue
            nodes = {**classes.nodes, fresh: [enode]}
            forced = EClasses(nodes, {**classes.roots, name: fresh}, classes.shapes, classes.dtypes)
            alternative = build_graph(forced, {**choice, fresh: enode}, graph)
            yield enode.op, lambda inputs, alternative=alternative: ts.evaluate(alternative, inputs)


def rewritten_agree(rule: Rule, seeds: range = range(3)) -> bool:
    """Saturate the rule's example with the rule alone; every alternative at the roots matches the original:
    on values with IEEE specials, to 1e-6, for rules of the "ieee" and "index" models; on finite values, to
    1e-5, for rules of the "real" model (they hold up to rounding)."""
    graph = rule.example()
    # patterns match the constants in their folded form: let the (index-proved) constant views run beside them
    # and contractions rewrite MatMul terms: the pattern that makes them runs beside them
    wanted = {"patterns": ("reshape_const", "expand_const"), "contractions": ("matmul",)}.get(rule.stage, ())
    helpers = tuple(r for r in RULES if r.name in wanted)
    saturated = saturate(graph, rules=(rule, *helpers), iterations=2 if not helpers else 4)
    classes = read_eclasses(saturated.egraph, saturated.roots)
    assert all(len(classes.nodes[root]) >= 2 for root in classes.roots.values()), f"{rule.name} did not fire"
    alternatives = list(root_alternatives(classes, graph))
    real = rule.model == "real"
    for seed in seeds:
        inputs = finite_inputs(graph, seed) if real else random_inputs(graph, seed)
        before = ts.evaluate(graph, inputs)
        for _, alternative in alternatives:
            after = alternative(inputs)
            for out, value in before.items():
                if not np.allclose(after[out], value, rtol=1e-5 if real else 1e-6, atol=1e-9 if real else 0,
                                   equal_nan=True):
                    return False
    return True


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_rewritten_graphs_evaluate_like_the_original(rule: Rule) -> None:
    assert rewritten_agree(rule)


def test_the_numeric_check_catches_an_unsound_rule() -> None:
    x, shape, dtype = var("x", TExpr), var("shape", Vec[i64]), var("dtype", String)
    zero = encode_value(0.0)

    def example() -> ts.Graph:
        g = ts.Graph("mul_zero")
        v = g.input("x", (4, 5), "float32").node
        g.outputs["out"] = P.binary(Op.MUL, v, P.constant(0.0, v.shape, v.dtype))
        return g

    unsound = Rule("mul_zero", "x * 0 -> 0 (wrong for inf and nan)",
                   rewrite(Mul(x, Const(zero, shape, dtype))).to(Const(zero, shape, dtype)), (), example)
    assert not rewritten_agree(unsound)
