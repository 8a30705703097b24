"""testing.tinymodels: the tiny targets and drafters the real-engine tests serve. The config checks run anywhere;
the rest builds them with the vLLM 0.32.0 venv's Python (marked realengine)."""
from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import tempfile
from pathlib import Path

import pytest

from specdeploy import drafter as drafter_mod
from specdeploy.values.errors import SpecdeployError
from specdeploy.checkpoint.modelcfg import TargetModel
from specdeploy.checkpoint.safetensors_io import checkpoint_tensors
from specdeploy.testing import tinymodels

realengine = pytest.mark.realengine


def test_configs_have_the_shapes_the_engines_need():
    for kind in ("deepseek_v3", "kimi_k2", "kimi_k25"):
        t = tinymodels.text_config(kind)
        assert t["kv_lora_rank"] + t["qk_rope_head_dim"] == 576 and t["torch_dtype"] == "bfloat16"
        assert t["n_routed_experts"] > t["num_experts_per_tok"] and t["first_k_dense_replace"] < t["num_hidden_layers"]
    assert tinymodels.text_config("kimi_k2")["model_type"] == "kimi_k2"
    llama = tinymodels.config("llama")
    assert (llama["hidden_size"], llama["num_hidden_layers"], llama["torch_dtype"]) == (256, 4, "float32")
    k2 = tinymodels.config("kimi_k2")
    assert k2["auto_map"]["AutoConfig"].startswith("configuration_kimi_k2.")
    wrapper = tinymodels.config("kimi_k25")
    assert wrapper["architectures"] == ["KimiK25ForConditionalGeneration"] and wrapper["model_type"] == "kimi_k25"
    assert wrapper["text_config"]["model_type"] == "kimi_k2" and "auto_map" not in wrapper["text_config"]
    assert tinymodels.SPECIALS[wrapper["media_placeholder_token_id"]] == "<|media_pad|>"
    with pytest.raises(SpecdeployError):
        tinymodels.config("qwen")
    with pytest.raises(SpecdeployError):
        tinymodels.drafter("llama", "perfect")


def _files(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.is_file()}


def _tensor(info, fmt: str) -> list:
    with open(info.file, "rb") as fh:
        fh.seek(info.begin)
        data = fh.read(info.nbytes)
    return list(struct.unpack(f"<{len(data) // struct.calcsize(fmt)}{fmt}", data))


@realengine
def test_a_target_answers_each_token_with_its_successor():
    """Greedy generation with transformers (the venv's) follows the recorded successor table."""
    d = tinymodels.target("llama")
    script = (
        "import json, sys, torch\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "d = sys.argv[1]\n"
        "tok = AutoTokenizer.from_pretrained(d)\n"
        "ids = tok.apply_chat_template([{'role': 'user', 'content': 'the engine verifies'}],"
        " add_generation_prompt=True, tokenize=True, return_dict=True)['input_ids']\n"
        "m = AutoModelForCausalLM.from_pretrained(d)\n"
        "out = m.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0].tolist()\n"
        "print(json.dumps({'prompt': ids, 'generated': out[len(ids):]}))\n")
    r = subprocess.run([str(tinymodels.python()), "-c", script, str(d)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    meta = tinymodels.meta(d)
    specials = meta["special_tokens"]
    assert got["prompt"][0] == specials["<|im_user|>"] and got["prompt"][-1] == specials["<|im_middle|>"]
    want, t = [], got["prompt"][-1]
    for _ in range(12):
        t = meta["successor"][t]
        want.append(t)
    assert got["generated"] == want
    assert not set(want) & set(specials.values())  # never a special token: generation runs to max_tokens


@realengine
@pytest.mark.parametrize("kind", tinymodels.KINDS)
def test_drafters_are_in_the_exporters_layout_and_pass_the_doctor(kind):
    target = tinymodels.target(kind)
    t = TargetModel.load(target)
    meta = tinymodels.meta(target)
    eot = meta["special_tokens"]["<|im_end|>"]
    for quality in tinymodels.QUALITIES:
        path = tinymodels.drafter(kind, quality)
        d = drafter_mod.Drafter.load(path)
        assert d.fmt == "llama" and d.target_hidden == t.hidden and d.vocab == t.vocab
        sel = tinymodels.meta(path)["draft_vocab"]
        assert d.draft_vocab == len(sel) < t.vocab and eot in sel
        assert not set(sel) & (set(meta["special_tokens"].values()) - {eot})
        tensors = checkpoint_tensors(path)
        assert (tensors["d2t"].dtype, tensors["d2t"].shape) == ("I64", (len(sel),))
        assert (tensors["t2d"].dtype, tensors["t2d"].shape) == ("BOOL", (t.vocab,))
        assert [i + off for i, off in enumerate(_tensor(tensors["d2t"], "q"))] == sel
        assert [i for i, b in enumerate(_tensor(tensors["t2d"], "?")) if b] == sel
        assert tensors["fc.weight"].shape == (d.hidden, 3 * t.hidden)
        rep = drafter_mod.check(path, target, "vllm", "0.32.0")
        assert rep.ok and not [f for f in rep.findings if f.severity == "warning"], rep.to_dict()
    if kind == "llama":  # a Llama target is an EAGLE-3 target of vLLM 0.16.0 too
        assert drafter_mod.check(tinymodels.drafter(kind, "good"), target, "vllm", "0.16.0").ok


@realengine
def test_artifacts_are_cached_by_content_and_regenerate_byte_for_byte():
    a = tinymodels.target("llama")
    assert tinymodels.target("llama") == a and (a / ".specdeploy-key").read_text().strip() == \
        tinymodels.target_key("llama")
    with tempfile.TemporaryDirectory() as tmp:
        again = Path(tmp)
        tinymodels._generate(tinymodels._target_spec("llama"), again)
        assert _files(again) == {k: v for k, v in _files(a).items() if k != ".specdeploy-key"}
    d = tinymodels.drafter("llama", "good")
    with tempfile.TemporaryDirectory() as tmp:
        again = Path(tmp)
        tinymodels._generate(dict(tinymodels._drafter_spec("llama", "good"), target=str(a)), again)
        assert _files(again) == {k: v for k, v in _files(d).items() if k != ".specdeploy-key"}
