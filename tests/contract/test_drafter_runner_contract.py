"""Contract tests: the doctor's model-runner rules (engines/vllm_tables.py DRAFTER: v2_default, v2_eagle3,
v2_nested_layer_ids, v2_aux_for_every_head) held to each release's own code. The CPU builds cannot run the V2
model runner (it needs a Triton with a CPU backend: vLLM 0.32.0 answers "Model Runner V2 requires Triton"), so
the V2 tap selection is not measured by the acceptance oracle; here V2's own selection function
(``get_eagle3_aux_layers_from_config`` in v1/worker/gpu/spec_decode/eagle/eagle3_utils.py) is taken out of every
release that has it and called on generated drafter configs, and its answers are the doctor's."""
from __future__ import annotations

import ast
import itertools
import types

import pytest
from packaging.version import Version

from specdeploy.engines import upstream
from specdeploy.engines import vllm as vl

pytestmark = pytest.mark.contract

# every release with a V2 EAGLE-3 tap selection that the tables were read against, and 0.16.0 (none)
RELEASES = sorted({"0.16.0", "0.17.0", "0.18.0", "0.19.0", "0.20.0", "0.21.0", "0.22.0", "0.24.0", "0.26.0",
                   "0.27.0", "0.32.0", "0.33.0"}, key=Version)
UTILS = "v1/worker/gpu/spec_decode/eagle/eagle3_utils.py"
DEFAULT = (2, 30, 58)  # the target's own default, which V2 uses when the function answers nothing


def _function(src: str, name: str):
    """A top-level function of a release's module, compiled alone (its body reads only attributes and dicts)."""
    tree = ast.parse(src)
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if fn is None:
        return None
    fn.returns = None
    for a in fn.args.args:
        a.annotation = None
    ns: dict = {}
    exec(compile(ast.Module([fn], type_ignores=[]), f"<{name}>", "exec"), ns)  # noqa: S102
    return ns[name]


def _spec(cfg: dict, method: str = "eagle3"):
    """The speculative config as the function reads it: hf_config holds the drafter config's keys as attributes
    (EAGLEConfig copies them), dicts stay dicts."""
    hf = types.SimpleNamespace(**cfg)
    return types.SimpleNamespace(method=method, draft_model_config=types.SimpleNamespace(hf_config=hf))


IDS = (None, [1, 29, 57], [3, 31, 59])


def _configs():
    for top, nested, layer_ids in itertools.product(IDS, IDS, IDS):
        cfg, ec = {"model_type": "llama"}, {"use_aux_hidden_state": True}
        if top is not None:
            cfg["eagle_aux_hidden_state_layer_ids"] = top
        if nested is not None:
            ec["eagle_aux_hidden_state_layer_ids"] = nested
        if layer_ids is not None:
            ec["layer_ids"] = layer_ids
        cfg["eagle_config"] = ec
        yield cfg, top, layer_ids


@pytest.mark.parametrize("version", RELEASES)
def test_v2_tap_selection_is_the_doctors(version):
    vllm = upstream.source("vllm", version) / "vllm"
    path = vllm / UTILS
    a = vl.VLLM(version)
    has = vl.DRAFTER["v2_eagle3"].contains(version)
    assert path.is_file() == has, (version, path)
    if not has:
        return
    select = _function(path.read_text(), "get_eagle3_aux_layers_from_config")
    assert select is not None
    n = 0
    for cfg, top, layer_ids in _configs():
        got = select(_spec(cfg))
        engine = list(got) if got else list(DEFAULT)
        doctor, _ = a.drafter_taps_v2(top, layer_ids, list(DEFAULT))
        assert doctor == engine, (version, cfg, got)
        n += 1
    assert n == 27


@pytest.mark.parametrize("version", RELEASES)
def test_v2_aux_states_for_heads_without_them(version):
    """Until 0.33.0 the V2 runner asks the target for aux states for every EAGLE-3 head; 0.33.0's
    requires_aux_hidden_states reads eagle_config.use_aux_hidden_state."""
    vllm = upstream.source("vllm", version) / "vllm"
    if not vl.DRAFTER["v2_eagle3"].contains(version):
        return
    utils = (vllm / UTILS).read_text()
    runner = (vllm / "v1/worker/gpu/model_runner.py").read_text()
    requires = _function(utils, "requires_aux_hidden_states")
    if vl.DRAFTER["v2_aux_for_every_head"].contains(version):
        assert requires is None and "self.use_aux_hidden_state_outputs = True" in runner
        cond = runner.split("self.use_aux_hidden_state_outputs = True")[0][-400:]
        assert "eagle3" in cond and "use_aux_hidden_state" not in cond
    else:
        assert requires is not None and "requires_aux_hidden_states(" in runner
        off = _spec({"eagle_config": {"use_aux_hidden_state": False}})
        assert requires(off) is False
        assert requires(_spec({"eagle_config": {}})) is True and requires(_spec({})) is True


def _default_archs(src: str):
    for node in ast.parse(src).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id ==
                                                "DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES" for t in node.targets):
            return {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return None


@pytest.mark.parametrize("version", RELEASES)
def test_v2_default_rule(version):
    """The default runner rule per release (VllmConfig.use_v2_model_runner and the architecture list)."""
    src = (upstream.source("vllm", version) / "vllm" / "config" / "vllm.py").read_text()
    envs = (upstream.source("vllm", version) / "vllm" / "envs.py").read_text()
    rule = next(((r, archs) for span, r, archs in vl.DRAFTER["v2_default"] if span.contains(version)), None)
    assert rule is not None, version
    r, archs = rule
    prop = src.split("def use_v2_model_runner", 1)[1].split("\n    def ", 1)[0] if "def use_v2_model_runner" in src \
        else ""
    if r == "v1":
        assert "VLLM_USE_V2_MODEL_RUNNER: bool = False" in envs and not prop
        return
    assert "VLLM_USE_V2_MODEL_RUNNER: bool | None = None" in envs and "HAS_TRITON" in prop
    listed = _default_archs(src)
    body = src.split("def _is_default_v2_model_runner_model", 1)[1].split("\n    def ", 1)[0] \
        if "def _is_default_v2_model_runner_model" in src else ""
    if r == "v2":
        assert "_is_default_v2_model_runner_model" not in prop and listed is None
        return
    assert listed == set(archs)
    if r == "listed-dense":
        assert "not model_config.is_moe and not model_config.is_quantized" in body
    elif r == "listed":
        assert "is_moe" not in body
    else:
        assert "or not model_config.is_moe" in body and "is_attention_free" in body
