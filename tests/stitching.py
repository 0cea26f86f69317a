"""A layered compile sabotaged at its stitching, for the tests that the end-to-end check catches it (on the CPU and
on the GPU)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from tensorsmith import pipeline
from tensorsmith.ir.layers import Layers


def cross_the_stitching(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every compile stitch its first layer to the second layer's weights (its own carried input kept)."""
    real = pipeline.stitched

    def crossed(model, layers: Layers, programs):
        pieces = list(layers.pieces)
        pieces[0] = replace(pieces[0], reads=pieces[0].reads[:1] + pieces[1].reads[1:])   # layer 1's weights
        return real(model, Layers(tuple(pieces), layers.repeats), programs)
    monkeypatch.setattr(pipeline, "stitched", crossed)
