"""The cost model refitted to one GPU's measured kernels: per archetype, measured ~ scale * predicted ** power.

The kernel-time records (`kernel_times.py`) keep each measured kernel's features and the uncorrected model's
prediction. A fit in log space per archetype (a line through (log predicted, log measured), least squares) corrects
the model where it is biased: an archetype it prices as faster than it runs is priced slower against the others when
the search weighs one partition against another. A power above zero keeps the order of one archetype's schedules.
The fit is judged on records it was not fitted on: a random share held out, its error before and after.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

MIN_RECORDS = 12        # an archetype's records needed for a fit: fewer leave it uncorrected
HELD_OUT = 0.25         # of the records, drawn at random: what the fit is judged on, never fitted on
POWER_RANGE = (0.5, 1.5)   # a fitted power outside it is a fit to noise: the correction keeps power 1 (scale alone)


@dataclass(frozen=True)
class Fit:
    """One archetype's correction and how well it predicts records it did not see."""

    archetype: str
    scale: float
    power: float
    fitted_on: int
    held_out: int
    error_before: float     # median |log(predicted / measured)| on the held-out records, as a factor (1.0: exact)
    error_after: float      # the same with the correction

    @property
    def correction(self) -> tuple[str, float, float]:
        return (self.archetype, self.scale, self.power)


def fit(records: list[dict], seed: int = 0) -> list[Fit]:
    """A fit per archetype with MIN_RECORDS usable records (features with a finite positive prediction, a positive
    measured time), kept only where it predicts the held-out records better than the model did."""
    by_archetype: dict[str, list[tuple[float, float]]] = {}
    for record in records:
        features = record.get("features") or {}
        predicted, measured = features.get("predicted_s"), record.get("seconds")
        if (isinstance(predicted, (int, float)) and isinstance(measured, (int, float)) and math.isfinite(predicted)
                and predicted > 0 and measured > 0):
            by_archetype.setdefault(str(features.get("archetype")), []).append((math.log(predicted),
                                                                                math.log(measured)))
    fits = []
    for archetype, points in sorted(by_archetype.items()):
        if len(points) < MIN_RECORDS:
            continue
        shuffled = random.Random(seed).sample(points, len(points))
        cut = max(1, round(HELD_OUT * len(points)))
        held, train = shuffled[:cut], shuffled[cut:]
        log_scale, power = _line(train)
        before = _median_error(held, 0.0, 1.0)
        after = _median_error(held, log_scale, power)
        if after < before:
            fits.append(Fit(archetype, math.exp(log_scale), power, len(train), len(held), before, after))
    return fits


def _line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares y = a + b x, with b kept within POWER_RANGE (else b = 1 and a the mean offset)."""
    n = len(points)
    mean_x, mean_y = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    power = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread if spread > 0 else 1.0
    if not POWER_RANGE[0] <= power <= POWER_RANGE[1]:
        power = 1.0
    return mean_y - power * mean_x, power


def _median_error(points: list[tuple[float, float]], log_scale: float, power: float) -> float:
    errors = sorted(abs(log_scale + power * x - y) for x, y in points)
    middle = len(errors) // 2
    median = errors[middle] if len(errors) % 2 else (errors[middle - 1] + errors[middle]) / 2
    return math.exp(median)
