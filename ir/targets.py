"""Compilation targets: the GPU facts that codegen and the cost model need, one record per target."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import TargetError


@dataclass(frozen=True)
class Target:
    """A GPU generation. Bandwidth and FLOP rates are measured ceilings where we have them."""

    name: str
    arch: str                   # NVRTC's --gpu-architecture
    description: str
    sm_count: int
    shared_bytes_per_block: int
    l2_bytes: int
    hbm_bytes_per_s: float
    fp32_flops: float


TARGETS: dict[str, Target] = {
    # H200 figures measured on this project's lent H200 (device copy 4.3 TB/s); FP32 from the datasheet.
    "sm90": Target("sm90", "sm_90", "NVIDIA Hopper (H100, H200)", 132, 227 * 1024, 60 * 2**20, 4.3e12, 67e12),
    "sm80": Target("sm80", "sm_80", "NVIDIA Ampere (A100)", 108, 163 * 1024, 40 * 2**20, 1.9e12, 19.5e12),
}


def get_target(name: str) -> Target:
    """The target called `name`, or a TargetError that lists the known ones."""
    try:
        return TARGETS[name]
    except KeyError:
        known = ", ".join(f"{t.name} ({t.description})" for t in TARGETS.values())
        raise TargetError(f"unknown target {name!r}; known targets: {known}") from None
