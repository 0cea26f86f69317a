"""tensorsmith.search: from the e-graph to a verified KernelProgram (extraction, kernel boundaries, schedules,
the cost model, beam search and MCTS, Z3 pruning, random tests)."""
from .engine import SearchConfig, SearchProgress, SearchResult, SearchStats, search_program
from .extract import Form, canonical_hash, extract, extract_forms
from .partition import partition
from .verify import VerificationError, random_inputs, relative_l2, verify_program

__all__ = ["Form", "canonical_hash", "extract", "extract_forms", "partition", "search_program", "SearchConfig",
           "SearchProgress", "SearchResult", "SearchStats",
           "VerificationError", "random_inputs", "relative_l2", "verify_program"]
