"""The discovery shown (issue 19, item 5): the rewrites a chosen form depends on, in order from the graph as written,
not every rule that fired. Real saturations and extractions of the forms tests' graphs (tests/search/test_forms.py)."""
from __future__ import annotations

from typing import Callable

import pytest

from tensorsmith import rewrites
from tensorsmith.ir.graph import Graph
from tensorsmith.rewrites.derivation import chain_text, derivation
from tensorsmith.search import Form, canonical_hash, extract_forms
from form_cases import chain_left_first, row_scaled_linear, shared_operand

# graph -> the rules its cheapest other form depends on, in order, and rules that fired that it does not need
CHAINS: dict[Callable[[], Graph], tuple[tuple[str, ...], set[str]]] = {
    chain_left_first: (("matmul", "matmul_assoc"), {"mul_comm", "matmul_assoc_left"}),
    shared_operand: (("matmul", "matmul_factor"), {"mul_comm", "add_comm", "matmul_distribute"}),
    row_scaled_linear: (("rmsnorm_matmul",), {"mul_comm", "matmul"}),
}


def _fired(saturated: rewrites.Saturated) -> list[str]:
    return [name for name, count in saturated.report.matches if count]


def _other_form(graph: Graph) -> tuple[Form, list[str]]:
    """The cheapest form other than the one written, as the search chooses it for these graphs, and the rules that
    fired while saturating."""
    saturated = rewrites.saturate(graph)
    forms = extract_forms(saturated)
    return forms[1], _fired(saturated)


def _extracts(graph: Graph, rules: list[str], chosen: Graph) -> bool:
    """Whether saturating `graph` with only `rules` (by name) gives `chosen` among its extracted forms."""
    kept = tuple(rule for rule in rewrites.RULES if rule.name in rules)
    forms = extract_forms(rewrites.saturate(graph, kept))
    return canonical_hash(chosen) in {canonical_hash(form.graph) for form in forms}


@pytest.mark.parametrize("make", list(CHAINS), ids=[make.__name__ for make in CHAINS])
def test_the_chain_names_the_rules_the_chosen_form_needs_in_order_and_not_the_others_that_fired(
        make: Callable[[], Graph]) -> None:
    graph = make()
    form, fired = _other_form(graph)
    expected, unneeded = CHAINS[make]
    assert unneeded <= set(fired), fired      # they fired, and are left out
    found = derivation(graph, form.graph, fired)
    assert found.stopped == "minimal" and found.rules == expected, found
    assert found.trials >= len(fired) and found.seconds < 30


@pytest.mark.parametrize("make", list(CHAINS), ids=[make.__name__ for make in CHAINS])
def test_the_chains_rules_alone_reproduce_the_chosen_form_and_none_of_them_can_go(make: Callable[[], Graph]) -> None:
    """Checked by extraction itself, not by the derivation's own test: saturation with the chain's rules alone gives
    the chosen form among its forms; with any one of them left out, it does not."""
    graph = make()
    form, fired = _other_form(graph)
    rules = list(derivation(graph, form.graph, fired).rules)
    assert _extracts(graph, rules, form.graph)
    for left_out in rules:
        assert not _extracts(graph, [rule for rule in rules if rule != left_out], form.graph), left_out


def test_a_derivation_without_time_says_it_was_cut_short_and_keeps_every_rule_that_fired() -> None:
    graph = chain_left_first()
    form, fired = _other_form(graph)
    found = derivation(graph, form.graph, fired, seconds=0.0)
    assert found.stopped == "time_limit" and set(found.rules) == set(fired)
    assert "cut short" in chain_text(found.rules, found.stopped, found.seconds)


def test_a_form_the_rules_do_not_reach_is_not_derived() -> None:
    """The shared-operand form from the chain's rules: no set of them derives it, and the chain says so."""
    graph = shared_operand()
    form, _ = _other_form(graph)
    found = derivation(graph, form.graph, ["mul_comm", "matmul", "matmul_assoc"])
    assert found.stopped == "not_derived" and found.rules == ()
    assert chain_text(found.rules, found.stopped, found.seconds).startswith("not found")


def test_saturation_reports_the_rules_in_the_order_they_first_fired() -> None:
    report = rewrites.saturate(chain_left_first()).report
    assert set(report.first_fired) == {name for name, count in report.matches if count}
    assert report.first_fired.index("matmul") < report.first_fired.index("matmul_assoc")
