"""Contract tests: how each engine runs a speculative method whose draft layers ship in the target (MTP), read from
the release sources the adapters claim, and the command specdeploy renders for it."""
from __future__ import annotations

import ast
import re

import pytest

from specdeploy.engines import get, get_adapter, upstream
from specdeploy.engines import sglang as sg
from specdeploy.engines import vllm_tables as vt
from specdeploy.hostvars.schema import validate_host

from .upstream_facts import vllm_spec_keys

pytestmark = pytest.mark.contract


def _host(engine, version, method):
    return validate_host("contract", {
        "specdeploy_engine": engine, "specdeploy_engine_version": version, "specdeploy_hardware": "h200_nvl8",
        "specdeploy_model_path": "/models/deepseek-v3", "specdeploy_spec_enabled": True,
        "specdeploy_spec_method": method, "specdeploy_drafter_path": "/models/drafter"})


def _function(tree: ast.AST, name: str) -> ast.FunctionDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


@pytest.mark.parametrize("version", vt.MTP_MODEL_TYPES_READ)
def test_vllm_mtp_takes_the_targets_own_layers_and_specdeploy_renders_no_drafter(version):
    spec_py = (upstream.source("vllm", version) / "vllm" / "config" / "speculative.py").read_text()
    tree = ast.parse(spec_py)
    # "mtp" is a method of the release
    mtp_types = next(n for n in ast.walk(tree) if isinstance(n, ast.Assign)
                     and any(isinstance(t, ast.Name) and t.id == "MTPModelTypes" for t in n.targets))
    assert "mtp" in {c.value for c in ast.walk(mtp_types) if isinstance(c, ast.Constant)}
    # without a model, the mtp method takes the target's: `if self.model is None ...: if self.method == "mtp":
    # ... self.model = ... target_model_config ...`
    post_init = ast.unparse(_function(tree, "__post_init__"))
    m = re.search(r"if self\.model is None[^\n]*:\n\s+if self\.method == 'mtp':(.*?)\n\s+elif", post_init, re.S)
    assert m and "self.model = " in m.group(1) and "target_model_config" in m.group(1)
    # hf_config_override turns each recorded target model type into an MTP drafter with n_predict from the key
    override = ast.unparse(_function(tree, "hf_config_override"))
    for model_type in vt.MTP_MODEL_TYPES:
        m = re.search(r"if hf_config\.model_type in \(([^)]*)\):\n\s+hf_config\.model_type = 'deepseek_mtp'",
                      override)
        assert m and f"'{model_type}'" in m.group(1), model_type
    assert "getattr(hf_config, 'num_nextn_predict_layers'" in override
    assert vt.SPEC_METHODS["mtp"].target_key == "num_nextn_predict_layers"
    # the rendered config: the method's name, no model, and only keys SpeculativeConfig has
    cfg = get_adapter("vllm", version).spec_config(_host("vllm", version, "mtp"), None)
    assert cfg["method"] == "mtp" and "model" not in cfg
    assert set(cfg) <= set(vllm_spec_keys(upstream.source("vllm", version)))


def _sglang_mtp_archs(root) -> set[str]:
    """The target architectures whose draft model path the release defaults to the target's (the list before
    ``speculative_draft_model_path = ... model_path``)."""
    files = [root / "sglang" / "srt" / "server_args.py", root / "sglang" / "srt" / "arg_groups" / "speculative_hook.py"]
    out: set[str] = set()
    for f in files:
        if not f.is_file():
            continue
        text = f.read_text()
        for m in re.finditer(r"model_arch in \[([^\]]*)\]:\s*\n\s*if [a-z_.]*speculative_draft_model_path is None:"
                             r"(.*?)(?:\n\s*else:)", text, re.S):
            if "model_path" in m.group(2):
                out |= set(re.findall(r'"(\w+)"', m.group(1)))
    return out


@pytest.mark.parametrize("version", sg.MTP_TARGETS_READ)
def test_sglang_nextn_defaults_its_draft_path_to_the_target_for_the_recorded_architectures(version):
    root = upstream.source("sglang", version)
    archs = _sglang_mtp_archs(root)
    recorded = {a for a, span in sg.MTP_TARGETS.items() if span.contains(version)}
    assert archs == recorded, (sorted(archs - recorded), sorted(recorded - archs))
    assert "KimiK25ForConditionalGeneration" not in archs
    argv = get_adapter("sglang", version).command(_host("sglang", version, "mtp"), None).argv
    assert argv[argv.index("--speculative-algorithm") + 1] == "NEXTN"
    assert "--speculative-draft-model-path" not in argv
    assert get("sglang").draft_source("mtp") == "target"
