"""tensorsmith.rewrites: the egglog term language, rule sets, bounded saturation, Z3 proofs of rules."""
from .derivation import SECONDS as DERIVATION_SECONDS, Derivation, chain_text, derivation
from .eclasses import ExtractionError
from .proofs import Claim, Verdict, check, prove
from .rule import Rule
from .rules import CLAIMS, RULES
from .saturate import STAGES, Saturated, SaturationReport, Stage, StageReport, saturate
from .term import TExpr, from_egglog, to_egglog

__all__ = ["Claim", "Verdict", "check", "prove", "CLAIMS", "RULES", "Rule", "Saturated", "SaturationReport",
           "DERIVATION_SECONDS", "Derivation", "chain_text", "derivation", "Stage", "STAGES", "StageReport",
           "ExtractionError", "saturate", "TExpr", "from_egglog", "to_egglog"]
