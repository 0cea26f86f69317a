"""Which kernels a baseline ran, from PyTorch's profiler: each kernel's class, and whether the baseline took the path
its users get (a baseline on a slow path makes every ratio against it a flattering one).

A profile is plain data, `Profile(kernels, ops)`: the GPU kernels of one call with their microseconds, and the names
of the ATen ops it dispatched. `slow_path` reads one, so that a recorded profile can be checked without a GPU.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# A kernel's class from its name, first match wins. Inductor's Triton kernels by their prefix first (triton_poi:
# pointwise; triton_red / triton_per: reductions; triton_tem: a template, a matmul), since their names list every op
# they fused (a pointwise kernel that prepares cuDNN's attention has "attention" in its name); then cuBLAS (nvjet,
# xmma, gemv), cuDNN's and flash attention, and ATen's own kernels.
KERNEL_CLASSES: tuple[tuple[str, str], ...] = (
    ("elementwise", r"^triton_poi"),
    ("softmax", r"^triton_(red|per).*softmax"),
    ("normalisation", r"^triton_(red|per).*(norm|rsqrt)"),
    ("reduction", r"^triton_(red|per)"),
    ("attention", r"^triton_tem.*attention|^(?!triton).*(flash|fmha|sdpa|attention|_attn)"),
    ("matmul", r"^triton_tem|gemm|gemv|nvjet|xmma|wgmma|cutlass|_mm_|bmm|matmul"),
    ("normalisation", r"norm|rsqrt"),
    ("softmax", r"softmax|logsumexp"),
    ("elementwise", r"elementwise|vectorized|unrolled|pointwise"),
    ("reduction", r"reduce"),
    ("copy", r"memcpy|memset|copy|cat|fill"),
)
OTHER = "other"
# A matmul kernel that runs on the CUDA cores, not the tensor cores: cuBLAS's matrix-vector and small-N kernels, and
# SIMT GEMMs (ffma: float32 multiply-adds, as SDPA's math path runs a 16-bit model's scores). Float32 products
# legitimately run these, so a profile is flagged only where they hold much of the time.
SIMT_MATMUL = r"gemv|gemmSN|gemmk1|sgemm|simt|ffma|dot_kernel"
SIMT_SHARE = 0.25          # the share of a 16-bit model's matmul time on SIMT kernels past which it is flagged
SDPA_MATH_OP = "aten::_scaled_dot_product_attention_math"
SLOW_PATH = "not at its best"   # how a flagged baseline's failure begins
KEPT_KERNELS = 40          # a profile keeps its most expensive kernels by name


@dataclass
class Profile:
    """One call's GPU kernels (name -> microseconds, summed over launches of that name) and its ATen ops' names."""

    kernels: dict[str, float] = field(default_factory=dict)
    ops: list[str] = field(default_factory=list)

    def by_class(self) -> dict[str, float]:
        """Microseconds per kernel class, largest first."""
        totals: dict[str, float] = {}
        for name, us in self.kernels.items():
            cls = kernel_class(name)
            totals[cls] = totals.get(cls, 0.0) + us
        return dict(sorted(totals.items(), key=lambda item: -item[1]))


def kernel_class(name: str) -> str:
    """The class of a kernel by its name (KERNEL_CLASSES), or 'other'."""
    lowered = name.lower()
    return next((cls for cls, pattern in KERNEL_CLASSES if re.search(pattern, lowered)), OTHER)


def slow_path(profile: Profile, calls_sdpa: bool, half_precision_matmuls: bool) -> str | None:
    """Why a baseline did not run as its users' code runs at its best, or None: attention on SDPA's math path (or as
    separate kernels where the reference calls SDPA), or a float16/bfloat16 model whose matmul time is mostly on
    kernels without tensor cores. A profile with no kernels (none recorded) is not judged by its kernels."""
    if SDPA_MATH_OP in profile.ops:
        return "its attention ran SDPA's math path (a batched matmul, a softmax, another matmul), not a fused kernel"
    classes = profile.by_class()
    if calls_sdpa and profile.kernels and "attention" not in classes:
        return "the reference calls scaled_dot_product_attention but no fused attention kernel ran"
    matmul = {name: us for name, us in profile.kernels.items() if kernel_class(name) == "matmul"}
    simt = {name: us for name, us in matmul.items() if re.search(SIMT_MATMUL, name, re.IGNORECASE)}
    total = sum(matmul.values())
    share = sum(simt.values()) / total if total else 0.0
    if half_precision_matmuls and share > SIMT_SHARE:
        return (f"{share:.0%} of its 16-bit matmul time ran on kernels without tensor cores "
                f"({', '.join(sorted({_short(name) for name in simt}))})")
    return None


def record(torch: Any, run: Any) -> Profile:
    """The profile of one call of `run` (warmed up already), on the GPU."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        run()
        torch.cuda.synchronize()
    kernels: dict[str, float] = {}
    ops: set[str] = set()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[event.name] = kernels.get(event.name, 0.0) + event.time_range.elapsed_us()
        elif event.name.startswith("aten::"):
            ops.add(event.name)
    kept = dict(sorted(kernels.items(), key=lambda item: -item[1])[:KEPT_KERNELS])
    return Profile(kept, sorted(ops))


def _short(name: str) -> str:
    """A kernel's name without its template arguments, for one line."""
    return name.split("<")[0].split("(")[0][:60]
