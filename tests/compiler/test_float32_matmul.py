"""Float32 matmuls run on the tensor cores as 3xTF32 (the matmul archetype), not on the CUDA cores' row reduction:
a float32 model compiles to as few kernels as its float16 twin, and its program matches the reference."""
from __future__ import annotations

import pytest

import tensorsmith as ts
from tensorsmith import nn
from tensorsmith.codegen.declare import KernelFacts
from tensorsmith.codegen.schedules import default_schedule
from tensorsmith.codegen.spaces import MATMUL
from tensorsmith.ir.targets import TARGETS
from tensorsmith.search.partition import partition
from tensorsmith.search.prune import kernel_facts
from tensorsmith.search.verify import random_inputs, relative_l2


def _mlp(dtype: str, tokens: int = 64, width: int = 128, hidden: int = 512) -> ts.Graph:
    """GPT-2's MLP: LayerNorm, a linear and GELU, a linear back and the residual."""
    g = ts.Graph(f"mlp_{dtype}")
    x = g.input("x", (tokens, width), dtype)
    h = nn.layer_norm(x, g.input("gamma", (width,), dtype), g.input("beta", (width,), dtype))
    h = nn.gelu(nn.linear(h, g.input("w1", (hidden, width), dtype), g.input("b1", (hidden,), dtype)))
    g.output("y", x + nn.linear(h, g.input("w2", (width, hidden), dtype), g.input("b2", (width,), dtype)))
    return g


def test_a_float32_mlp_takes_the_matmul_archetype_and_as_few_kernels_as_float16() -> None:
    programs = {dtype: ts.compile(_mlp(dtype), budget_s=3, profile=False, progress=False)
                for dtype in ("float16", "float32")}
    archetypes = {dtype: sorted(k.archetype for k in p.kernel_program.kernels) for dtype, p in programs.items()}
    assert archetypes["float32"].count("matmul") == 2
    assert len(archetypes["float32"]) == len(archetypes["float16"])
    matmuls = [k for k in programs["float32"].kernels if "3xTF32" in k.source]   # the header says how it runs
    assert len(matmuls) == 2 and all("m16n8k8" in k.source and "tf32" in k.source for k in matmuls)
    graph = _mlp("float32")
    inputs = random_inputs(graph, seed=5)
    out = programs["float32"](device="cpu", **inputs)["y"]
    assert relative_l2(out, ts.evaluate(graph, inputs)["y"]) < 1e-5


def test_float32_matmul_schedules_never_take_wgmma() -> None:
    """wgmma takes 16-bit operands here: the space's rules with a float32 kernel's facts rule every wgmma point out,
    and its default schedule is mma.sync with K tiles of 32 floats."""
    valid = {size: [p for p in MATMUL.points()
                    if MATMUL.broken_rule(p, KernelFacts("matmul", itemsize=4, operand_bytes=size), TARGETS["sm90"])
                    is None]
             for size in (2, 4)}
    assert any(p["wgmma"] for p in valid[2]) and valid[4] and not any(p["wgmma"] for p in valid[4])
    program = partition(_mlp("float32", tokens=256))
    (matmul, _) = [k for k in program.kernels if k.archetype == "matmul"]
    shapes = {name: buffer.shape for name, buffer in program.buffers.items()}
    schedule = default_schedule(matmul, shapes)
    assert schedule["wgmma"] == 0 and schedule["bk"] == 32
    facts = kernel_facts(matmul, shapes)
    assert facts.operand_bytes == 4
    for target in ("sm90", "sm80"):   # the default is a point of the space on every target (the A100's 163 KiB)
        assert MATMUL.violation(default_schedule(matmul, shapes, TARGETS[target].arch), facts, TARGETS[target]) is None


def test_a_float32_torch_mlp_is_three_kernels_not_fifty() -> None:
    """The issue's new user: a float32 LayerNorm -> Linear -> GELU -> Linear block from PyTorch made 51 kernels
    (its matmuls on the row reduction, the norm's and GELU's pieces apart); now a norm and two fused matmuls."""
    torch = pytest.importorskip("torch")

    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm, self.up = torch.nn.LayerNorm(128), torch.nn.Linear(128, 512)
            self.down = torch.nn.Linear(512, 128)

        def forward(self, x: "torch.Tensor") -> "torch.Tensor":
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

    torch.manual_seed(0)
    module, x = MLP().eval(), torch.randn(64, 128)
    program = ts.from_torch(module, (x,), budget_s=3, progress=False)
    kernels = program.program.kernel_program.kernels
    assert sorted(k.archetype for k in kernels) == ["matmul", "matmul", "row_reduce"]
    with torch.no_grad():
        expected = module(x)
    assert float((program(x) - expected).norm() / expected.norm()) < 1e-5
