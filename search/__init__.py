"""tensorsmith.search: from the e-graph to a verified KernelProgram (extraction, kernel boundaries, random tests)."""
from .extract import extract
from .partition import partition
from .verify import VerificationError, random_inputs, relative_l2, verify_program

__all__ = ["extract", "partition", "VerificationError", "random_inputs", "relative_l2", "verify_program"]
