"""`tensorsmith bench`: the model suite of benchmarks/models/ against PyTorch on the GPU, in one table."""
from .case import Case, DeferredCase, causal_attention_flops

__all__ = ["Case", "DeferredCase", "causal_attention_flops"]
