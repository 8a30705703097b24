"""The adapters' span tables: versions ordered as PEP 440 orders them, every capability consulted somewhere, and
upstream sources taken from a wheel that fits Linux x86_64 / Python 3."""
import ast

import pytest
from contract.spans import claimed_spans, endpoints, in_span
from packaging.version import Version

from specdeploy import engines

from specdeploy.engines import upstream
from helpers import REPO

SRC = REPO / "src" / "specdeploy"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_versions_and_spans_compare_as_versions(engine):
    cls = engines.get(engine)
    assert list(cls.versions) == sorted(cls.versions, key=Version)
    spans = claimed_spans(engine)
    assert len(spans) > 20
    for span in spans:
        for v in cls.versions:
            assert span.contains(v) == in_span(v, span), (engine, v, span)
    first, last = cls.versions[0], cls.versions[-1]
    assert first in endpoints(engine) and last in endpoints(engine)


def test_span_order_is_not_string_order():
    span = engines.Span("0.5.10")
    assert not span.contains("0.5.9") and span.contains("0.5.10") and "0.5.9" > "0.5.10"
    assert engines.Span(None, "0.5.2").contains("0.5.1.post3") and not engines.Span("0.5.1.post1").contains("0.5.1")


def _consulted() -> set[str]:
    """Capability names read in the package: adapter.has("x"), capabilities["x"], capabilities.get("x"),
    CAPABILITIES["x"]."""
    out = set()
    for f in SRC.rglob("*.py"):
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.args \
                    and isinstance(n.args[0], ast.Constant):
                if n.func.attr == "has" or (n.func.attr == "get" and isinstance(n.func.value, ast.Attribute)
                                            and n.func.value.attr == "capabilities"):
                    out.add(n.args[0].value)
            if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant):
                v = n.value
                name = v.attr if isinstance(v, ast.Attribute) else v.id if isinstance(v, ast.Name) else ""
                if name in ("capabilities", "CAPABILITIES"):
                    out.add(n.slice.value)
    return out


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_capability_is_consulted(engine):
    unread = set(engines.get(engine).capabilities) - _consulted()
    assert not unread, f"{engine}: capabilities nothing reads: {sorted(unread)}"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_mla_drafter_capability_agrees_with_the_drafter_table(engine):
    cls = engines.get(engine)
    mla = [span for arch, span in cls.DRAFTER["archs"].items() if "Deepseek" in arch]
    for v in cls.versions:
        assert cls(v).has("mla_eagle3_drafter") == any(s.contains(v) for s in mla), (engine, v)


def test_fetch_takes_a_wheel_for_linux_x86_64_python3():
    files = [{"filename": n} for n in ("sglang-0.5.23-cp311-cp311-manylinux_2_34_aarch64.whl",
                                       "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl",
                                       "sglang-0.5.23-cp311-cp311-macosx_14_0_arm64.whl")]
    assert upstream.choose(files)["filename"].endswith("_x86_64.whl")
    assert upstream.choose(files + [{"filename": "sglang-0.5.23-py3-none-any.whl"}])["filename"] == \
        "sglang-0.5.23-py3-none-any.whl"
    assert upstream.choose(files[:1] + files[2:]) is None  # another platform's wheel is never taken
    assert upstream.choose([{"filename": "vllm-0.16.0.tar.gz"}])["filename"] == "vllm-0.16.0.tar.gz"


def test_sglang_api_key_goes_through_config_only_where_the_release_has_it():
    from specdeploy.hostvars.schema import HostVars
    base = {"specdeploy_engine": "sglang", "specdeploy_hardware": "h200_nvl8", "specdeploy_model_path": "/m",
            "specdeploy_spec_enabled": False, "specdeploy_api_key_file": "/keys/k"}
    old = HostVars(**base, specdeploy_engine_version="0.5.2")
    new = HostVars(**base, specdeploy_engine_version="0.5.3")
    a_old, a_new = engines.get_adapter("sglang", "0.5.2"), engines.get_adapter("sglang", "0.5.3")
    assert "--config" not in a_old.command(old).argv and a_old.command(old).credential is None
    assert [f.subject for f in a_old.validate_extras(old, "h")] == ["specdeploy_api_key_file"]
    cmd = a_new.command(new)
    assert cmd.argv[cmd.argv.index("--config") + 1] == "${CREDENTIALS_DIRECTORY}/sglang-api-key.yaml"
    assert a_new.validate_extras(new, "h") == []
