"""Each archetype's rules are declared once (codegen/spaces.py): the plain check the search enumerates with and the Z3
encoding are both built from that declaration, and agree on every point of every space."""
from __future__ import annotations

import dataclasses

import pytest
from graph_cases import CASES

import tensorsmith as ts
from tensorsmith.codegen.declare import KernelFacts
from tensorsmith.codegen.spaces import ARCHETYPES
from tensorsmith.ir.targets import TARGETS
from tensorsmith.search.partition import partition
from tensorsmith.search.prune import (feasible_schedules, kernel_facts, schedule_violations,
                                      valid_for_every_row_length)

# Facts each archetype's rules turn on: real kernels' facts, and edges (odd lengths, 1-byte and 8-byte elements,
# head dims past what fits, a body codegen cannot cache).
FACTS = {
    "pointwise": [KernelFacts("pointwise", 4096, 2), KernelFacts("pointwise", 1002, 4), KernelFacts("pointwise", 7, 1)],
    "row_reduce": [KernelFacts("row_reduce", 4096, 2, True, 1), KernelFacts("row_reduce", 1002, 4, True, 3),
                   KernelFacts("row_reduce", 32768, 4, True, 2), KernelFacts("row_reduce", 96, 8, False, 0),
                   KernelFacts("row_reduce", 1 << 20, 2, True, 1)],
    "matmul": [KernelFacts("matmul", itemsize=2), KernelFacts("matmul", itemsize=4),
               KernelFacts("matmul", itemsize=4, operand_bytes=4)],
    "attention": [KernelFacts("attention", itemsize=2, head_dims=dims)
                  for dims in ((64, 64), (128, 128), (256, 256), (128, 64), (512, 512))],
}


def test_every_archetype_is_exercised() -> None:
    assert set(FACTS) == set(ARCHETYPES)


@pytest.mark.parametrize("archetype", sorted(ARCHETYPES))
def test_z3_and_the_plain_check_agree_on_every_point(archetype: str) -> None:
    labels = {rule.label for rule in ARCHETYPES[archetype].rules}
    broken: set[str | None] = set()
    for facts in FACTS[archetype]:
        for target in (TARGETS["sm90"], TARGETS["sm80"]):
            z3_verdicts = feasible_schedules(facts, target)
            plain = schedule_violations(facts, target)
            assert len(z3_verdicts) == len(plain) == ARCHETYPES[archetype].size
            for verdict, (schedule, violated) in zip(z3_verdicts, plain):
                assert verdict.schedule == schedule and verdict.violated == violated, (facts, target.name, schedule)
                broken.add(violated)
    # the facts reach most rules (an agreement where every rule holds would show little), and some points are valid
    assert None in broken and len(broken & labels) >= len(labels) // 2, labels - broken


def test_kernels_of_real_programs_have_facts_both_checks_agree_on() -> None:
    for case in ("norms", "many_short_rows", "matmul", "integers"):
        program = partition(CASES[case]())
        shapes = {name: buf.shape for name, buf in program.buffers.items()}
        for kernel in program.kernels:
            facts = kernel_facts(kernel, shapes)
            z3_verdicts = [v.violated for v in feasible_schedules(facts, TARGETS["sm90"])]
            assert z3_verdicts == [violated for _, violated in schedule_violations(facts, TARGETS["sm90"])]
            assert z3_verdicts.count(None) > 0


def test_codegen_refuses_a_schedule_by_the_declared_rule() -> None:
    bad = {"bm": 64, "bn": 128, "bk": 32, "stages": 4, "warps_m": 1, "warps_n": 4, "split_k": 1, "wgmma": 1}
    assert ARCHETYPES["matmul"].violation(bad) == "wgmma: a warpgroup per 64 rows, BK 64, 3+ stages"
    assert ARCHETYPES["matmul"].violation({**bad, "bk": 64}) is None
    assert ARCHETYPES["matmul"].violation({**bad, "bk": 48}) == "bk in (32, 64)"


def softmax_facts(cols: int) -> KernelFacts:
    g = ts.Graph("softmax")
    g.output("y", ts.nn.softmax(g.input("x", (64, cols), "float16"), axis=-1))
    program = partition(g)
    return kernel_facts(program.kernels[0], {name: buf.shape for name, buf in program.buffers.items()})


def test_z3_decides_a_schedule_for_every_row_length_at_once() -> None:
    """A row length known only at run time (any multiple of 8 up to 64 Ki): Z3 finds, for each schedule valid at
    4096, a length that breaks it or shows there is none. Checked here by enumerating every length."""
    facts, target = softmax_facts(4096), TARGETS["sm90"]
    longest = 1 << 16
    answers = valid_for_every_row_length(facts, target, 8, longest)
    valid_at_4096 = [schedule for schedule, violated in schedule_violations(facts, target) if violated is None]
    assert set(answers) == set(valid_at_4096)
    always = [schedule for schedule, length in answers.items() if length is None]
    sometimes = {schedule: length for schedule, length in answers.items() if length is not None}
    assert always and sometimes
    archetype = ARCHETYPES["row_reduce"]
    for schedule, length in sometimes.items():   # each counterexample is one
        assert length % 8 == 0 and 0 < length <= longest
        assert archetype.violation(schedule, dataclasses.replace(facts, row_length=length), target) is not None
    lengths = range(8, longest + 1, 8)
    for schedule in always[::max(1, len(always) // 6)]:   # and a few of those shown valid throughout are
        assert all(archetype.violation(schedule, dataclasses.replace(facts, row_length=n), target) is None
                   for n in lengths), schedule
