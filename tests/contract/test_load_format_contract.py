"""The --load-format choices specdeploy accepts per engine version exist in that release's loader table, and the
ones it refuses for a version are really absent there."""
from __future__ import annotations

import pytest
from packaging.version import Version

from specdeploy.engines import upstream
from specdeploy.engines import get_adapter

from .spans import endpoints
from .test_engines_contract import VLLM_TESTED, _host
from .upstream_facts import sglang_load_formats, vllm_load_formats

pytestmark = pytest.mark.contract

# before, at and after the fast loaders' first release, and the first and last release of every load-format span
SGLANG_LOAD_TESTED = sorted({"0.5.6", "0.5.10", "0.5.23"}
                            | set(endpoints("sglang", list(get_adapter("sglang", "0.5.23").load_formats.values()))),
                            key=Version)


def _check(engine: str, version: str, real: frozenset[str]):
    adapter = get_adapter(engine, version)
    for fmt, span in adapter.load_formats.items():
        if span.contains(version):
            assert fmt in real, f"{engine} {version} has no load format '{fmt}'"
        else:
            assert fmt not in real, f"{engine} {version} has '{fmt}' (table says from {span.since})"
    fmt = max(f for f in adapter.load_formats if adapter.load_format_ok(f) and f != "auto")
    hv = _host(engine, version, specdeploy_load_format=fmt)
    argv = adapter.command(hv).argv
    assert argv[argv.index("--load-format") + 1] == fmt


@pytest.mark.parametrize("version", VLLM_TESTED)
def test_vllm_load_formats(version):
    _check("vllm", version, vllm_load_formats(upstream.source("vllm", version)))


@pytest.mark.parametrize("version", SGLANG_LOAD_TESTED)
def test_sglang_load_formats(version):
    _check("sglang", version, sglang_load_formats(upstream.source("sglang", version)))
