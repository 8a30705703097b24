"""specdeploy_load_format: version-aware --load-format for both engines."""
from __future__ import annotations

import pytest

from specdeploy.engines import get_adapter
from specdeploy.values.errors import SpecdeployError
from specdeploy.hostvars.schema import validate_host

BASE = {"specdeploy_hardware": "rtx_pro_6000_pcie", "specdeploy_model_path": "/models/k"}


@pytest.mark.parametrize("engine, version, fmt", [
    ("vllm", "0.18.0", "instanttensor"), ("vllm", "0.16.0", "fastsafetensors"),
    ("sglang", "0.5.23", "instanttensor"), ("sglang", "0.5.10", "runai_streamer")])
def test_accepted_formats_reach_the_command_line(engine, version, fmt):
    hv = validate_host("h", {**BASE, "specdeploy_engine": engine, "specdeploy_engine_version": version,
                             "specdeploy_load_format": fmt})
    argv = get_adapter(engine, version).command(hv).argv
    assert argv[argv.index("--load-format") + 1] == fmt


@pytest.mark.parametrize("engine, version, fmt, words", [
    ("vllm", "0.17.1", "instanttensor", "exists only from vllm 0.18.0"),
    ("sglang", "0.5.9", "fastsafetensors", "exists only from sglang 0.5.10"),
    ("vllm", "0.33.0", "fast", "is not a vllm 0.33.0 load format")])
def test_refused_formats_name_the_variable_and_the_choices(engine, version, fmt, words):
    with pytest.raises(SpecdeployError) as ei:
        validate_host("h", {**BASE, "specdeploy_engine": engine, "specdeploy_engine_version": version,
                            "specdeploy_load_format": fmt})
    p = next(x for x in ei.value.problems if x.subject == "specdeploy_load_format")
    assert words in p.message and "safetensors" in p.fix


def test_default_leaves_the_engine_on_auto():
    hv = validate_host("h", {**BASE, "specdeploy_engine": "vllm", "specdeploy_engine_version": "0.16.0"})
    assert "--load-format" not in get_adapter("vllm", "0.16.0").command(hv).argv
