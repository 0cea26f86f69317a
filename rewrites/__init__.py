"""tensorsmith.rewrites: the egglog term language, rule sets, bounded saturation, Z3 proofs of rules."""
from .proofs import Claim, Verdict, check, prove
from .rules import CLAIMS, RULES, Rule
from .saturate import Saturated, SaturationReport, StageReport, saturate
from .term import TExpr, from_egglog, to_egglog

__all__ = ["Claim", "Verdict", "check", "prove", "CLAIMS", "RULES", "Rule", "Saturated", "SaturationReport",
           "StageReport", "saturate", "TExpr", "from_egglog", "to_egglog"]
