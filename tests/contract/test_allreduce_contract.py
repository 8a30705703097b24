"""Contract: the all-reduce paths in front of NCCL that the engine adapters record (what `nccl choose` weights)
match the real vLLM and SGLang sources of each tested release."""
from __future__ import annotations

import ast
import re

import pytest
from packaging.version import Version

from specdeploy.engines import upstream
from specdeploy.engines import get_adapter
from specdeploy.engines import sglang as sg
from specdeploy.engines import vllm as vl
from specdeploy.values.hardware import PROFILES
from specdeploy.nccl.traffic import context

from .spans import _spans, endpoints

pytestmark = pytest.mark.contract

# The releases read when the tables were written, and the first and last release of every span in them.
VLLM_TESTED = sorted({"0.16.0", "0.17.1", "0.18.0", "0.22.0", "0.33.0"} | set(endpoints("vllm", _spans(
    [vl.CUSTOM_AR_WORLD_SIZES, vl.SYMM_MEM_INCLUSIVE, vl.FI_FUSION], []))), key=Version)
SGLANG_TESTED = sorted({"0.5.23"} | set(endpoints("sglang", _spans(
    [sg.FI_FUSION_AUTO, sg.FI_FUSION_ABSENT, sg.CUSTOM_AR_INCLUSIVE], []))), key=Version)


def _dict_literal(src: str, name: str) -> dict:
    """A module-level ``NAME = {...}`` (optionally annotated) evaluated with MiB = 1024 * 1024."""
    tree = ast.parse(src)
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == name and node.value is not None:
            return eval(compile(ast.Expression(node.value), name, "eval"), {"MiB": 1024 * 1024})  # noqa: S307
    raise AssertionError(f"{name} not found")


@pytest.mark.parametrize("version", VLLM_TESTED)
def test_vllm_allreduce_paths(version):
    root = upstream.source("vllm", version) / "vllm"
    dc = root / "distributed" / "device_communicators"
    ca = (dc / "custom_all_reduce.py").read_text()
    assert "max_size=8192 * 1024" in ca and vl.CUSTOM_AR_MAX == 8192 * 1024
    sizes = next(s for span, s in vl.CUSTOM_AR_WORLD_SIZES if span.contains(version))
    assert f"_SUPPORTED_WORLD_SIZES = {list(sizes)}" in ca
    assert re.search(r"return (self.batch_invariant or )?inp_size < self.max_size", ca)  # exclusive bound
    assert "self.world_size == 2 or self.fully_connected" in ca
    utils = (dc / "all_reduce_utils.py").read_text()
    for ours, theirs in ((vl.CUSTOM_AR_MAX_WITH_SYMM_MEM, "CUSTOM_ALL_REDUCE_MAX_SIZES"),
                         (vl.SYMM_MEM_MAX, "SYMM_MEM_ALL_REDUCE_MAX_SIZES")):
        table = _dict_literal(utils, theirs)
        assert {cc: table[cc] for cc in ours} == ours, f"vLLM {version} {theirs}"
    envs = (root / "envs.py").read_text()
    assert re.search(r'getenv\("VLLM_ALLREDUCE_USE_SYMM_MEM", "1"\)', envs)
    symm = (dc / "symm_mem.py").read_text()
    op = "<=" if vl.SYMM_MEM_INCLUSIVE.contains(version) else "<"
    assert "multicast_ptr == 0" in symm and f"return inp_size {op} self.max_size" in symm
    fusion = list((root / "compilation").rglob("allreduce_rms_fusion.py"))
    cfg = (root / "config" / "vllm.py").read_text()
    on_by_default = '"fuse_allreduce_rms": enable_allreduce_rms_fusion' in cfg
    assert on_by_default == vl.FI_FUSION.contains(version), f"vLLM {version}: fusion default"
    if on_by_default:
        table = _dict_literal(fusion[0].read_text(), "FI_ALLREDUCE_FUSION_MAX_SIZE_MB")
        ours = {int(cc.replace(".", "")): {ws: b / (1024 * 1024) for ws, b in t.items()}
                for cc, t in vl.FI_FUSION_MAX.items()}
        assert {cc: {ws: table[cc][ws] for ws in ours[cc]} for cc in ours} == ours


@pytest.mark.parametrize("version", SGLANG_TESTED)
def test_sglang_allreduce_paths(version):
    root = upstream.source("sglang", version) / "sglang" / "srt"
    ca = (root / "distributed" / "device_communicators" / "custom_all_reduce.py").read_text()
    assert "_MAX_CAR_SIZE = 8192 * 1024" in ca and sg.CUSTOM_AR_MAX == 8192 * 1024
    assert f"_SUPPORTED_WORLD_SIZES = {list(sg.CUSTOM_AR_WORLD_SIZES)}" in ca
    op = "<=" if sg.CUSTOM_AR_INCLUSIVE.contains(version) else "<"
    assert f"return inp_size {op} self.max_size" in ca
    utils = (root / "distributed" / "device_communicators" / "custom_all_reduce_utils.py").read_text()
    assert "world_size > 2 and not full_nvlink" in utils + ca  # in custom_all_reduce.py up to 0.5.9
    overrides = "".join(p.read_text() for p in root.rglob("*.py")
                        if "Auto-enabling FlashInfer AllReduce Fusion" in p.read_text())
    if sg.FI_FUSION_AUTO.contains(version):
        assert "KimiK25ForConditionalGeneration" in overrides
    if sg.FI_FUSION_ABSENT.contains(version):
        assert overrides == ""
    # the adapter reports sizes above the custom all-reduce as unknown where the fusion may be on
    paths = get_adapter("sglang", version).allreduce_paths(context(PROFILES["h200_nvl8"], 8, True))
    assert [p.max_bytes for p in paths] == [8192 * 1024] + ([] if sg.FI_FUSION_ABSENT.contains(version) else [None])
