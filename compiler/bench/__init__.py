"""`tensorsmith bench`: the model suite of benchmarks/models/ against PyTorch on the GPU, in one table."""
from .case import Case, fan_in_std

__all__ = ["Case", "fan_in_std"]
