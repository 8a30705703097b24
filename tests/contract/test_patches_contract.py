"""The vLLM patch set against the real 0.16.0/0.17.1 source releases (and 0.18.0/0.33.0, which need none)."""
from __future__ import annotations

import ast
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specdeploy.engines import upstream
from specdeploy.engines.patches import vllm as pv

pytestmark = pytest.mark.contract
SD = [sys.executable, "-m", "specdeploy.cli", "patch"]


@pytest.fixture(params=["0.16.0", "0.17.1"])
def tree(request, tmp_path):
    src = upstream.source("vllm", request.param)
    dst = tmp_path / f"vllm-{request.param}"
    shutil.copytree(src / "vllm", dst / "vllm")
    return dst


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((root / "vllm").rglob("*.py"))}


def _cls(tree, name):
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def test_apply_gives_files_that_pass_ast_checks_and_compile(tree):
    r = subprocess.run(SD + ["apply", "--engine", "vllm", "--root", str(tree), "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert {p["status"] for p in json.loads(r.stdout)["patches"]} == {"patched"}
    spec = (tree / pv.WHITELIST_FILE).read_text()
    ds = ast.parse((tree / pv.DS_FILE).read_text())
    kimi = ast.parse((tree / pv.KIMI_FILE).read_text())
    # 1. whitelist now lists the Kimi/DeepSeek model types inside the same list literal
    lst = next(n for n in ast.walk(ast.parse(spec)) if isinstance(n, ast.Assign)
               and getattr(n.targets[0], "id", "") in ("eagle3_target_supported", "aux_hidden_states_supported"))
    assert {"kimi_k2", "kimi_k25", "deepseek_v2", "deepseek_v3"} <= {e.value for e in lst.value.elts}
    # 2. image token branch for KimiK25 uses media_placeholder_token_id
    eagle = (tree / "vllm/v1/spec_decode/eagle.py").read_text()
    assert 'get_model_name(target_model) == "KimiK25ForConditionalGeneration"' in eagle
    assert "target_model.config.media_placeholder_token_id" in eagle
    # 3. SupportsEagle3: bases, methods, and aux collection in the decoder forward
    ds_cls = _cls(ds, "DeepseekV2ForCausalLM")
    assert "SupportsEagle3" in [ast.unparse(b) for b in ds_cls.bases]
    methods = {f.name: f for f in ds_cls.body if isinstance(f, ast.FunctionDef)}
    assert {"set_aux_hidden_state_layers", "get_eagle3_aux_hidden_state_layers"} <= set(methods)
    assert "(2, n_layers // 2, n_layers - 3)" in ast.unparse(methods["get_eagle3_aux_hidden_state_layers"])
    fwd = next(f for f in _cls(ds, "DeepseekV2Model").body if isinstance(f, ast.FunctionDef) and f.name == "forward")
    src = ast.unparse(fwd)
    loop = next(n for n in fwd.body if isinstance(n, ast.For))
    first = ast.unparse(loop.body[0])
    assert "self.aux_hidden_state_layers" in first and "hidden_states + residual" in first  # before the layer
    assert "return (hidden_states, aux_hidden_states)" in src
    k_cls = _cls(kimi, "KimiK25ForConditionalGeneration")
    assert "SupportsEagle3" in [ast.unparse(b) for b in k_cls.bases]
    k_methods = {f.name: ast.unparse(f) for f in k_cls.body if isinstance(f, ast.FunctionDef)}
    assert "self.language_model.set_aux_hidden_state_layers(layers)" in k_methods["set_aux_hidden_state_layers"]
    for rel in (pv.WHITELIST_FILE, pv.DS_FILE, pv.KIMI_FILE, "vllm/v1/spec_decode/eagle.py"):
        compile((tree / rel).read_text(), rel, "exec")


def test_second_apply_is_byte_identical(tree):
    pv.apply(tree)
    before = _digest(tree)
    res = pv.apply(tree)
    assert {r.status for r in res} == {"applied"}
    assert _digest(tree) == before


@pytest.mark.parametrize("version", ["0.18.0", "0.33.0"])
def test_fixed_releases_report_upstream(version):
    root = upstream.source("vllm", version)
    assert {r.status for r in pv.status(root)} == {"upstream"}


def test_drift_fails_loudly_and_changes_nothing(tree):
    ds = tree / pv.DS_FILE
    ds.write_text(ds.read_text().replace("for layer in islice(self.layers, self.start_layer, self.end_layer):",
                                         "for layer in self._iter_layers():"))
    before = _digest(tree)
    r = subprocess.run(SD + ["apply", "--engine", "vllm", "--root", str(tree)], capture_output=True, text=True)
    assert r.returncode == 1
    assert "deepseek_v2.py" in r.stderr and "anchor" in r.stderr and "Traceback" not in r.stderr
    assert _digest(tree) == before  # never a partial patch


def test_whitelist_drift_is_reported(tree):
    sp = tree / pv.WHITELIST_FILE
    sp.write_text(sp.read_text().replace("eagle3_target_supported = [", "SUPPORTED = [")
                  .replace("aux_hidden_states_supported = [", "SUPPORTED = ["))
    assert next(r for r in pv.status(tree) if r.id == pv.WHITELIST_ID).status == "drift"
    with pytest.raises(pv.PatchError):
        pv.apply(tree)
