"""A random-weight EAGLE-3 head of the right shape from the target's config alone (drafter/synth.py): the doctor
passes it for the target and release; its tensors are what the release builds; its weights are bounded and its
norms ones; its disk use is checked before writing and it is removed afterwards. (The real engine's probe on the
Kimi-K2.5 example's head: tests/realengine/test_real_vllm_price.py.)"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from specdeploy.checkpoint.modelcfg import TargetModel
from specdeploy.checkpoint.safetensors_io import read_array, tensors
from specdeploy.drafter import check, synth
from specdeploy.drafter.head import build
from specdeploy.drafter.model import Drafter
from specdeploy.engines import get_adapter
from specdeploy.values.errors import SpecdeployError

KIMI = Path(__file__).resolve().parents[3] / "examples" / "models" / "kimi-k2.5-int4"


def _disk(d: Path) -> int:
    return sum(os.stat(p).st_blocks * 512 for p in d.iterdir())


@pytest.mark.parametrize(("engine", "version"), [("vllm", "0.32.0"), ("vllm", "0.24.0"), ("sglang", "0.5.23")])
def test_the_kimi_heads_pass_the_doctor_and_hold_what_the_release_builds(tmp_path, engine, version):
    made = synth.write(tmp_path / "h", KIMI, engine, version, fill="zeros")
    head = Path(made["path"])
    rep = check(head, KIMI, engine, version)
    assert rep.ok, [f.line() for f in rep.findings]
    assert not [f for f in rep.findings if f.severity == "warning"], [f.line() for f in rep.findings]
    cfg = json.loads((head / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"], cfg["vocab_size"]) == (7168, 64, 128,
                                                                                                     163840)
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 30, 58]
    want = build(Drafter.load(head), TargetModel.load(KIMI), get_adapter(engine, version)).required
    got = {n: (t.dtype, t.shape) for n, t in tensors(head / "model.safetensors").items()}
    assert {n: s for n, (_, s) in got.items() if n in want} == want
    assert set(got) == set(want) | {"lm_head.weight", "d2t", "t2d"}
    assert got["lm_head.weight"] == ("BF16", (32000, 7168))
    # a sparse file: 2.4 GB of weights, next to nothing on disk
    assert made["bytes"] > 2e9 and _disk(head) < 2e6
    ts = tensors(head / "model.safetensors")
    d2t = read_array(ts["d2t"])
    sel = [i + int(d) for i, d in enumerate(d2t)]
    assert sel == sorted(sel) and 163586 in sel and max(sel) < 163840  # <|im_end|> drafts
    t2d = read_array(ts["t2d"])
    assert sum(bool(x) for x in t2d) == 32000 and all(t2d[i] for i in sel[:100])


def test_random_weights_are_bounded_and_norms_are_ones(tmp_path):
    target = tmp_path / "llama"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 512,
        "max_position_embeddings": 8192, "torch_dtype": "float32", "eos_token_id": 2}))
    made = synth.write(tmp_path / "h", target, "vllm", "0.32.0", fill="random", seed=3)
    ts = tensors(Path(made["path"]) / "model.safetensors")
    with open(ts["fc.weight"].file, "rb") as fh:
        fh.seek(ts["fc.weight"].begin)
        vals = struct.unpack("<4096f", fh.read(4096 * 4))
        fh.seek(ts["layers.0.input_layernorm.weight"].begin)
        ones = struct.unpack(f"<{ts['layers.0.input_layernorm.weight'].shape[0]}f",
                             fh.read(ts["layers.0.input_layernorm.weight"].nbytes))
    assert all(2 ** -7 <= abs(v) < 2 ** -6 for v in vals)
    assert 0.4 < sum(v > 0 for v in vals) / len(vals) < 0.6
    assert len(set(vals)) > 4000
    assert set(ones) == {1.0}
    rep = check(Path(made["path"]), target, "vllm", "0.32.0")
    assert rep.ok, [f.line() for f in rep.findings]


def test_the_disk_it_needs_is_checked_before_anything_is_written(tmp_path):
    with pytest.raises(SpecdeployError, match="needs 2.38 GB on disk, above the limit 1.00 GB"):
        synth.write(tmp_path / "h", KIMI, "vllm", "0.32.0", fill="random", max_bytes=10 ** 9)
    assert list(tmp_path.iterdir()) == []  # nothing staged is left behind


def test_an_existing_directory_is_never_written_over(tmp_path):
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "keep").write_text("x")
    with pytest.raises(SpecdeployError, match="exists"):
        synth.write(tmp_path / "h", KIMI, "vllm", "0.32.0", fill="zeros")
    assert (tmp_path / "h" / "keep").read_text() == "x"


def test_a_temporary_head_is_removed_after_its_block_even_on_failure(tmp_path):
    with synth.temporary_head(tmp_path, KIMI, "vllm", "0.32.0", fill="zeros") as made:
        assert (Path(made["path"]) / "model.safetensors").is_file()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError):
        with synth.temporary_head(tmp_path, KIMI, "vllm", "0.32.0", fill="zeros"):
            raise RuntimeError("the engine failed")
    assert list(tmp_path.iterdir()) == []


def test_a_target_without_its_shape_is_refused_by_name(tmp_path):
    t = tmp_path / "t"
    t.mkdir()
    (t / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                               "num_hidden_layers": 4}))
    with pytest.raises(SpecdeployError) as ei:
        synth.write(tmp_path / "h", t, "vllm", "0.32.0")
    assert "config.json" in str(ei.value)


def test_a_target_no_larger_than_the_draft_vocabulary_gets_a_full_vocabulary_head_without_a_map(tmp_path):
    """vLLM 0.32.0 builds no draft_id_to_target_id for a full draft vocabulary and refuses a d2t beside it (its
    CPU build: "There is no module or parameter named 'draft_id_to_target_id' in Eagle3LlamaForCausalLM")."""
    target = tmp_path / "t"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 4, "num_attention_heads": 8, "vocab_size": 512, "torch_dtype": "bfloat16"}))
    made = synth.write(tmp_path / "h", target, "vllm", "0.32.0", fill="zeros")
    assert made["config"]["draft_vocab_size"] == 512
    assert "d2t" not in made["tensors"] and "t2d" not in made["tensors"]
    assert made["tensors"]["lm_head.weight"] == ["BF16", [512, 256]]
