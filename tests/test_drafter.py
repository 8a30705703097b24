"""Drafter doctor on realistic-size sparse checkpoints: hidden 7168, draft vocab 32000, target vocab 163840."""
import json
import os
import subprocess
import sys

import pytest

from specdeploy.drafter import check, convert
from specdeploy.errors import SpecdeployError
from specdeploy.fixtures import drafter_config, write_drafter
from specdeploy.safetensors_io import checkpoint_tensors


@pytest.fixture
def target(repo):
    return repo / "examples/models/kimi-k2.5-int4"


def errors(rep):
    return {f.subject: f for f in rep.findings if f.severity == "error"}


def test_good_drafter_passes_vllm_and_is_sparse(tmp_path, target):
    d = write_drafter(tmp_path / "good")
    st = d / "model.safetensors"
    assert os.path.getsize(st) > 1.9e9 and os.stat(st).st_blocks * 512 < 5e6  # 2 GB apparent, sparse on disk
    rep = check(d, target, "vllm")
    assert rep.ok, rep.to_dict()


def test_trap_sglang_drops_layers0_names(tmp_path, target):
    d = write_drafter(tmp_path / "d")
    assert "layers.0.*" in errors(check(d, target, "sglang"))
    assert "layers.0.*" not in errors(check(d, target, "vllm"))  # vLLM accepts both


def test_trap_fc_4x(tmp_path, target):
    d = write_drafter(tmp_path / "d", fc_mult=4)
    e = errors(check(d, target, "vllm"))
    assert "fuses 4 hidden states" in e["fc.weight"].message


def test_trap_missing_d2t(tmp_path, target):
    d = write_drafter(tmp_path / "d", with_d2t=False)
    e = errors(check(d, target, "vllm"))
    assert "draft id i to target id i" in e["d2t"].message


def test_trap_d2t_int32_and_duplicates_and_eos(tmp_path, target):
    e = errors(check(write_drafter(tmp_path / "a", d2t_dtype="I32", with_t2d=False), target, "vllm"))
    assert "int64" in e["d2t"].message
    sel = list(range(32000))  # no EOS (163586) in the draft vocabulary
    e = errors(check(write_drafter(tmp_path / "b", selection=sel, with_t2d=False), target, "vllm"))
    assert "EOS" in e["d2t"].message
    dup = list(range(31997)) + [5, 163585, 163586]
    e = errors(check(write_drafter(tmp_path / "c", selection=dup, with_t2d=False), target, "vllm"))
    assert "duplicate" in e["d2t"].message


def test_trap_t2d_disagrees(tmp_path, target):
    from specdeploy.fixtures import drafter_tensors
    from specdeploy.safetensors_io import write_sparse
    d = write_drafter(tmp_path / "d")
    specs, data = drafter_tensors()
    mask = bytearray(data["t2d"])
    mask[163586] = 0
    mask[100000] = 1
    data["t2d"] = bytes(mask)
    write_sparse(d / "model.safetensors", specs, data)
    assert "t2d" in errors(check(d, target, "vllm"))


def test_trap_aux_off_by_one(tmp_path, target):
    # SpecForge-style: only the nested key, SGLang numbering [1,29,57] == vLLM default -1: vLLM warns only
    cfg = drafter_config(eagle_aux_hidden_state_layer_ids=None)
    rep = check(write_drafter(tmp_path / "a", cfg), target, "vllm")
    assert rep.ok and any(f.severity == "warning" and "nested" in f.message for f in rep.findings)
    # trained taps differ from the default: vLLM silently uses the wrong layers -> error
    cfg = drafter_config(eagle_aux_hidden_state_layer_ids=None,
                         eagle_config={"eagle_aux_hidden_state_layer_ids": [3, 20, 40]})
    assert "eagle_aux_hidden_state_layer_ids" in errors(check(write_drafter(tmp_path / "b", cfg), target, "vllm"))
    # the classic off-by-one: SGLang given vLLM numbers under its key
    cfg = drafter_config(eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 30, 58]})
    e = errors(check(write_drafter(tmp_path / "c", cfg), target, "sglang"))
    assert "off by one" in e["aux layers"].message
    # top-level non-default ids only: SGLang ignores them
    cfg = drafter_config(eagle_aux_hidden_state_layer_ids=[3, 20, 40], eagle_config=None)
    e = errors(check(write_drafter(tmp_path / "d", cfg, prefix="midlayer."), target, "sglang"))
    assert "eagle_config.eagle_aux_hidden_state_layer_ids" in e


def test_trap_norm_before_residual(tmp_path, target):
    cfg = drafter_config(norm_before_residual=True)
    d = write_drafter(tmp_path / "a", cfg, prefix="midlayer.")
    assert "norm_before_residual" in errors(check(d, target, "sglang"))
    assert check(d, target, "vllm").ok
    rep = check(write_drafter(tmp_path / "b", drafter_config(norm_before_residual=None)), target, "vllm")
    assert any(f.subject == "norm_before_residual" and f.severity == "warning" for f in rep.findings)
    with pytest.raises(SpecdeployError) as ei:
        convert(d, target, "sglang", tmp_path / "out")
    assert "norm_before_residual" in str(ei.value)


def test_trap_hidden_and_vocab_mismatch(tmp_path, target):
    cfg = drafter_config(hidden_size=4096, target_hidden_size=4096)
    e = errors(check(write_drafter(tmp_path / "a", cfg, hidden=4096, target_hidden=4096), target, "vllm"))
    assert "target_hidden_size" in e
    e = errors(check(write_drafter(tmp_path / "b", drafter_config(vocab_size=129280)), target, "vllm"))
    assert "vocab_size" in e


def test_mla_drafter_needs_one_layer(tmp_path, target):
    cfg = drafter_config(architectures=["Eagle3DeepseekV2ForCausalLM"], num_hidden_layers=2)
    assert "num_hidden_layers" in errors(check(write_drafter(tmp_path / "a", cfg), target, "vllm"))


def test_convert_for_sglang_renames_hardlinks_and_records(tmp_path, target):
    src = write_drafter(tmp_path / "src", drafter_config(eagle_aux_hidden_state_layer_ids=None))
    (src / "tokenizer_config.json").write_text("{}")
    out = tmp_path / "sglang"
    meta = convert(src, target, "sglang", out)
    assert check(out, target, "sglang").ok
    names = set(checkpoint_tensors(out))
    assert "midlayer.self_attn.q_proj.weight" in names and not any(n.startswith("layers.0.") for n in names)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 29, 57]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 30, 58]
    assert cfg["norm_before_residual"] is False
    assert os.stat(out / "tokenizer_config.json").st_ino == os.stat(src / "tokenizer_config.json").st_ino
    assert os.stat(out / "model.safetensors").st_blocks * 512 < 5e6  # still sparse
    assert json.loads((out / "specdeploy-conversion.json").read_text())["actions"] == meta["actions"]
    # the renamed data is byte-identical for the small tensors
    from specdeploy.safetensors_io import read_tensor
    assert read_tensor(checkpoint_tensors(out)["d2t"]) == read_tensor(checkpoint_tensors(src)["d2t"])


def test_convert_for_vllm_hardlinks_weights(tmp_path, target):
    src = write_drafter(tmp_path / "src", drafter_config(eagle_aux_hidden_state_layer_ids=None,
                        eagle_config={"eagle_aux_hidden_state_layer_ids": [3, 20, 40]}))
    assert not check(src, target, "vllm").ok
    out = tmp_path / "vllm"
    convert(src, target, "vllm", out)
    assert check(out, target, "vllm").ok
    assert json.loads((out / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [4, 21, 41]
    assert os.stat(out / "model.safetensors").st_ino == os.stat(src / "model.safetensors").st_ino


def test_cli_json_and_exit_codes(tmp_path, target):
    d = write_drafter(tmp_path / "d", fc_mult=4)
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "drafter", "check", str(d), "--target", str(target),
                        "--engine", "vllm", "--json"], capture_output=True, text=True)
    assert r.returncode == 1
    out = json.loads(r.stdout)
    assert out["ok"] is False and any(f["subject"] == "fc.weight" and f["fix"] for f in out["findings"])
    r = subprocess.run([sys.executable, "-m", "specdeploy.cli", "drafter", "check", str(tmp_path / "nope"),
                        "--target", str(target), "--engine", "vllm"], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "does not exist" in r.stderr
