"""The MLA EAGLE-3 head's parameter list per release (drafter/mla.py over DRAFTER["mla"]): the published TorchSpec
Kimi-K2.5 MLA head (header-only, its real names and shapes) and edits of it, judged as each release's loader
treats them (tests/contract/test_drafter_mla_contract.py holds the facts to the release sources)."""
import json

import pytest

from specdeploy.drafter import check, convert
from specdeploy.testing.drafter_corpus import write_drafter as corpus_drafter
from helpers import TESTS

ENTRY = json.loads((TESTS / "data/drafters/corpus/lightseekorg-kimi-k2.5-eagle3-mla.json").read_text())
A = "layers.0.self_attn."


@pytest.fixture
def target(repo):
    return repo / ENTRY["target"]


def errors(rep):
    return {f.subject: f for f in rep.findings if f.severity == "error"}


def _drafter(tmp_path, name="d", config=None, drop=(), add=None, taps_top=True):
    e = json.loads(json.dumps(ENTRY))
    if taps_top:  # the taps where every runner reads them (the published config's nested ids are another test's)
        e["config"]["eagle_aux_hidden_state_layer_ids"] = [2, 30, 58]
    e["config"].update(config or {})
    for k in [k for k, v in e["config"].items() if v is None]:
        del e["config"][k]
    for n in drop:
        del e["tensors"][n]
    e["tensors"].update(add or {})
    return corpus_drafter(e, tmp_path / name)


@pytest.mark.parametrize("engine,version", [("vllm", "0.18.0"), ("vllm", "0.22.0"), ("vllm", "0.32.0"),
                                            ("vllm", "0.33.0"), ("sglang", "0.5.12"), ("sglang", "0.5.23")])
def test_published_head_matches_every_parameter(tmp_path, target, engine, version):
    rep = check(_drafter(tmp_path), target, engine, version)
    assert rep.ok, [f.line() for f in rep.findings if f.severity != "info"]
    assert not [f for f in rep.findings if f.severity == "warning" and f.subject in ("tensor names", "lm_head.weight")]


def test_no_mla_head_before_its_release(tmp_path, target):
    d = _drafter(tmp_path)
    assert "architectures" in errors(check(d, target, "vllm", "0.16.0"))
    assert "architectures" in errors(check(d, target, "sglang", "0.5.11"))


@pytest.mark.parametrize("name", [A + "q_a_layernorm.weight", A + "kv_b_proj.weight", "layers.0.hidden_norm.weight",
                                  "norm.weight"])
def test_a_missing_parameter_stays_uninitialised(tmp_path, target, name):
    d = _drafter(tmp_path, drop=[name])
    for engine, version in (("vllm", "0.18.0"), ("vllm", "0.32.0"), ("sglang", "0.5.23")):
        e = errors(check(d, target, engine, version))
        assert "missing tensors" in e and name in e["missing tensors"].message, (engine, version)


def test_wrong_latent_shape(tmp_path, target):
    d = _drafter(tmp_path, add={A + "kv_a_proj_with_mqa.weight": ["BF16", [512, 14336]]})  # rope dims dropped
    for engine, version in (("vllm", "0.32.0"), ("sglang", "0.5.23")):
        assert "tensor shapes" in errors(check(d, target, engine, version))


def test_without_q_lora_rank_no_release_loads_it(tmp_path, target):
    d = _drafter(tmp_path, config={"q_lora_rank": None})
    for engine, version in (("vllm", "0.18.0"), ("vllm", "0.26.0"), ("sglang", "0.5.23")):
        assert "q_lora_rank" in errors(check(d, target, engine, version)), (engine, version)


def test_a_tensor_the_head_does_not_build(tmp_path, target):
    """input_norm.weight (a head trained with norm_before_fc: no MLA head builds it): vLLM drops it without a word
    until 0.24.0 and raises from 0.26.0; SGLang logs and skips it. Either way the head runs without it."""
    d = _drafter(tmp_path, add={"input_norm.weight": ["BF16", [21504]]})
    assert "dropped without a word" in errors(check(d, target, "vllm", "0.22.0"))["tensor names"].message
    assert "load fails" in errors(check(d, target, "vllm", "0.32.0"))["tensor names"].message
    assert "skipped with a log line" in errors(check(d, target, "sglang", "0.5.23"))["tensor names"].message
    # a name with a fused shard's part is looked up as the fused parameter before 0.26.0: KeyError
    d = _drafter(tmp_path, "s", add={"layers.0.mlp.shared_experts.gate_proj.weight": ["BF16", [18432, 7168]]})
    assert "KeyError" in errors(check(d, target, "vllm", "0.22.0"))["tensor names"].message


def test_fc_norm_per_release(tmp_path, target):
    fcn = {f"fc_norm.{k}.weight": ["BF16", [7168]] for k in range(3)}
    d = _drafter(tmp_path, config={"fc_norm": True}, add=fcn)
    assert "fc_norm" in errors(check(d, target, "vllm", "0.18.0"))         # not read: built nowhere
    assert "never applies" in errors(check(d, target, "vllm", "0.22.0"))["fc_norm"].message
    for engine, version in (("vllm", "0.24.0"), ("vllm", "0.32.0"), ("sglang", "0.5.13"), ("sglang", "0.5.23")):
        assert check(d, target, engine, version).ok, (engine, version)
    assert "fc_norm" in errors(check(d, target, "sglang", "0.5.12"))
    legacy = _drafter(tmp_path, "u", config={"use_aux_norm": True}, add=fcn)  # SGLang's older name
    assert check(legacy, target, "sglang", "0.5.23").ok


def test_norm_before_fc_is_read_by_no_mla_head(tmp_path, target):
    d = _drafter(tmp_path, config={"norm_before_fc": True}, add={"input_norm.weight": ["BF16", [21504]]})
    for engine, version in (("vllm", "0.32.0"), ("sglang", "0.5.23")):
        assert "norm_before_fc" in errors(check(d, target, engine, version))


def test_aux_count_from_the_ids(tmp_path, target):
    """Four nested ids make fc fuse four states where the release counts them (vLLM 0.22.0 on, SGLang)."""
    ids = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 20, 40, 57], "use_aux_hidden_state": True},
           "eagle_aux_hidden_state_layer_ids": None}
    d = _drafter(tmp_path, config=ids, add={"fc.weight": ["BF16", [7168, 4 * 7168]]}, taps_top=False)
    assert "fc.weight" not in errors(check(d, target, "vllm", "0.32.0"))
    assert "fc.weight" in errors(check(d, target, "vllm", "0.18.0"))


def test_no_aux_states(tmp_path, target):
    d = _drafter(tmp_path, config={"eagle_config": {"use_aux_hidden_state": False},
                                   "eagle_aux_hidden_state_layer_ids": None}, drop=["fc.weight"], taps_top=False)
    e = errors(check(d, target, "vllm", "0.32.0", runner="v1"))
    assert "runs fc on whatever it gets" in e["eagle_config.use_aux_hidden_state"].message
    assert "eagle_config.use_aux_hidden_state" not in errors(check(d, target, "sglang", "0.5.23"))


def test_vocabulary_head(tmp_path, target):
    """SGLang's MLA head, like its Llama head, loads the target's lm_head over the shipped one when the config has
    no draft_vocab_size (a warning: a trained head collapses, a copy of the target's changes nothing; convert keeps
    the shipped one); vLLM keeps it, and shares the target's only when the checkpoint has none."""
    d = _drafter(tmp_path, config={"draft_vocab_size": None})
    rep = check(d, target, "sglang", "0.5.23")
    warned = [f for f in rep.findings if f.severity == "warning" and f.subject == "lm_head.weight"]
    assert rep.ok and warned and "load_lm_head_from_target" in warned[0].message
    assert not [f for f in check(d, target, "vllm", "0.32.0").findings if f.subject == "lm_head.weight"
                and f.severity != "info"]
    out = convert(d, target, "sglang", tmp_path / "out", "0.5.23")
    assert json.loads((tmp_path / "out/config.json").read_text())["draft_vocab_size"] == 163840 and out["check"]["ok"]
    shared = _drafter(tmp_path, "shared", config={"draft_vocab_size": None}, drop=["lm_head.weight"])
    assert check(shared, target, "vllm", "0.32.0").ok
    tied = _drafter(tmp_path, "tied", config={"tie_word_embeddings": True})
    assert "tie_word_embeddings" in errors(check(tied, target, "sglang", "0.5.23"))


def test_model_type_vllm_rewrites_into_an_mtp_config(tmp_path, target):
    d = _drafter(tmp_path, config={"model_type": "deepseek_v3"})
    e = errors(check(d, target, "vllm", "0.32.0"))
    assert "MTP" in e["model_type"].message and "model_type" in e
    assert "model_type" not in errors(check(d, target, "sglang", "0.5.23"))
    meta = convert(d, target, "vllm", tmp_path / "out", "0.32.0")
    assert json.loads((tmp_path / "out/config.json").read_text())["model_type"] == "deepseek_v2"
    assert meta["check"]["ok"]
    k3 = _drafter(tmp_path, "k3", config={"model_type": "kimi_k3"})
    assert "model_type" in errors(check(k3, target, "vllm", "0.32.0"))
    assert "model_type" not in errors(check(k3, target, "vllm", "0.26.0"))  # rewritten from 0.27.0
