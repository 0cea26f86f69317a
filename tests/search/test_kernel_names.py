"""Kernels and their temporaries are named after what the user called for them, through rewrites and imports."""
from __future__ import annotations

import re

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.rewrites import saturate
from tensorsmith.search import extract
from tensorsmith.search.partition import build_program, materialisable, unfused

PRIMITIVE_NAME = re.compile(r"_(sum|max|mul|add|exp2|log2|recip|sqrt|cast|contiguous)\d+_*$")


def norm_then_softmax() -> ts.Graph:
    g = ts.Graph("named")
    x = g.input("x", (8, 64), "float32")
    w = g.input("w", (64,), "float32")
    g.output("y", nn.softmax(nn.rms_norm(x, w) * 2.0, axis=-1))
    return g


def test_row_kernels_are_named_after_the_users_op() -> None:
    """Each row reduction's kernel says which layer it computes (they were `sum0`, `max3`, ...)."""
    graph = norm_then_softmax()
    every = [k.name for k in unfused(graph).kernels]
    assert any("rms_norm" in name for name in every) and any("softmax" in name for name in every), every
    assert any(re.search(r"_mul\d+$", name) for name in every), every      # the user's own `* 2.0`
    assert not [name for name in every if re.search(r"_(sum|max)\d+$", name)], every


def test_names_survive_the_e_graph() -> None:
    """Nodes rebuilt from the e-graph keep the op the user called, so the rewritten program's kernels are named
    alike (they were named after `compile`, the function the user's line called)."""
    graph = extract(saturate(norm_then_softmax()))
    program, _ = build_program(graph, {id(n) for n in materialisable(graph) if n.op.name in ("SUM", "MAX")})
    names = [k.name for k in program.kernels]
    assert any("rms_norm" in name for name in names) and any("softmax" in name for name in names), names
    assert not [name for name in names if PRIMITIVE_NAME.search(name) and "mul" not in name], names


def test_a_temporary_never_takes_a_users_name() -> None:
    """An input called like a generated temporary keeps its name; the temporary takes another."""
    g = ts.Graph("clash")
    x = g.input("rms_norm0", (8, 64), "float32")
    w = g.input("w", (64,), "float32")
    g.output("y", nn.rms_norm(x, w) * 2.0)
    program = unfused(g)
    temps = [name for name, buffer in program.buffers.items() if buffer.role == "temp"]
    assert temps and "rms_norm0" not in temps and program.buffers["rms_norm0"].role == "input"
