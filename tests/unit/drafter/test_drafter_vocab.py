"""The vocabulary head and map where only values tell right from wrong: the doctor warns (it reads headers and
the d2t ids, not lm_head's values) and convert keeps the shipped head where that is right either way."""
import json
import struct

from specdeploy.checkpoint.safetensors_io import write_sparse
from specdeploy.drafter import check, convert
from specdeploy.testing.oracle_variants import by_name, tensor_specs, write_sparse_pair


def _warnings(rep, subject):
    return [f for f in rep.findings if f.severity == "warning" and f.subject == subject]


def test_a_reordered_d2t_is_warned_not_refused(tmp_path):
    """The oracle measured a reversed d2t at 0% acceptance (A-d2t-reversed on 0.16.0); the files cannot tell it
    from a head trained in that order, so the doctor warns and names the descent."""
    v = by_name()["A-d2t-reversed"]
    t, d = write_sparse_pair(v, tmp_path)
    rep = check(d, t, "vllm", "0.32.0")
    assert rep.ok and _warnings(rep, "d2t") and "ascending" in _warnings(rep, "d2t")[0].message
    t, d = write_sparse_pair(by_name()["A-aux-both"], tmp_path / "ok")
    assert not _warnings(check(d, t, "vllm", "0.32.0"), "d2t")


def test_sglang_swaps_a_full_vocabulary_head_without_draft_vocab_size(tmp_path):
    """V-as-trained: a head with its own full-vocabulary lm_head and no draft_vocab_size. SGLang loads the target's
    head over it (load_lm_head_from_target): a warning, since a copy of the target's head (ModelOpt writes one)
    looks the same; convert writes draft_vocab_size, which keeps the shipped head on every release."""
    v = by_name()["V-as-trained"]
    t, d = write_sparse_pair(v, tmp_path)
    rep = check(d, t, "sglang", "0.5.23")
    assert rep.ok and _warnings(rep, "lm_head.weight")
    assert not _warnings(check(d, t, "vllm", "0.32.0"), "lm_head.weight")  # vLLM keeps a shipped head
    meta = convert(d, t, "sglang", tmp_path / "out", "0.5.23")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["draft_vocab_size"] == 512
    assert any("draft_vocab_size" in a for a in meta["actions"])
    assert not _warnings(check(tmp_path / "out", t, "sglang", "0.5.23"), "lm_head.weight")


def test_d2t_order_reads_only_the_ids(tmp_path):
    """A duplicate is an error, a descent a warning, and the check reads d2t alone (a sparse checkpoint)."""
    v = by_name()["A-aux-both"]
    t, d = write_sparse_pair(v, tmp_path)
    specs = tensor_specs(v)
    d2t = list(v.d2t)
    d2t[5], d2t[6] = d2t[6] + 1, d2t[5] - 1  # swap two neighbouring target ids
    write_sparse(d / "model.safetensors", specs, {"d2t": struct.pack(f"<{len(d2t)}q", *d2t),
                                                  "t2d": bytes(v.t2d)})
    w = _warnings(check(d, t, "vllm", "0.16.0"), "d2t")
    assert w and "draft id 6" in w[0].message
