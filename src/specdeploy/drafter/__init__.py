"""Drafter doctor: validate an EAGLE-3 drafter against its target for one engine version, and convert it.

Reads config.json and safetensors headers (through the safetensors library), plus only the small d2t/t2d
tensors; never the weights. ``model`` reads the drafter, ``rules`` checks it, ``convert`` writes an
engine-ready copy.
"""
from specdeploy.drafter.convert import convert
from specdeploy.drafter.model import (
    CONVERT,
    META_FILE,
    Drafter,
    default_aux,
    end_of_turn_ids,
    engine_taps,
    is_convertible,
    resolve_version,
    trained_taps,
)
from specdeploy.drafter.rules import check

__all__ = ["CONVERT", "META_FILE", "Drafter", "check", "convert", "default_aux", "end_of_turn_ids", "engine_taps",
           "is_convertible", "resolve_version", "trained_taps"]
