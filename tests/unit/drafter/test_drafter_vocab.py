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


def test_d2t_beside_a_full_vocabulary(tmp_path):
    """V-d2t-identity (a full-vocabulary head shipping an identity d2t): served on 0.16.0, refused on 0.32.0,
    which builds no draft_id_to_target_id for it (measured); convert drops the identity map."""
    v = by_name()["V-d2t-identity"]
    t, d = write_sparse_pair(v, tmp_path)
    assert check(d, t, "vllm", "0.16.0").ok
    rep = check(d, t, "vllm", "0.32.0")
    err = [f for f in rep.errors if f.subject == "d2t"]
    assert err and "draft_id_to_target_id" in err[0].message and "drops d2t" in err[0].fix
    meta = convert(d, t, "vllm", tmp_path / "out", "0.32.0")
    from specdeploy.checkpoint.safetensors_io import checkpoint_tensors
    names = set(checkpoint_tensors(tmp_path / "out"))
    assert meta["check"]["ok"] and "d2t" not in names and "t2d" not in names and "lm_head.weight" in names
    assert _warnings(check(d, t, "vllm", "0.28.0"), "d2t")  # a release between the ones read: not known


def test_a_missing_input_norm_before_per_aux_norms_is_harmless(tmp_path):
    """F-nbf-spurious: a head trained with fc_norm whose config also says norm_before_fc, no input_norm weights.
    0.32.0 builds input_norm (left at ones) and applies fc_norm after it, which removes that uniform scale: the
    engine measured full acceptance, and the doctor says so (0.16.0 refuses the fc_norm weights altogether)."""
    t, d = write_sparse_pair(by_name()["F-nbf-spurious"], tmp_path)
    rep = check(d, t, "vllm", "0.32.0", runner="v1")
    assert rep.ok and [f for f in rep.findings if f.subject == "input_norm.weight" and f.severity == "info"]
    t, d = write_sparse_pair(by_name()["A-nbf-spurious"], tmp_path / "a")  # no fc_norm after it: it matters
    assert "missing tensors" in {f.subject for f in check(d, t, "vllm", "0.32.0", runner="v1").errors}


def test_dropping_d2t_keeps_every_other_tensor_byte_for_byte(tmp_path):
    """The converted checkpoint without d2t/t2d: every kept tensor's bytes as they were (a dense, non-sparse
    file: the copy reads several ranges through one descriptor)."""
    import os

    from specdeploy.checkpoint.safetensors_io import read_header
    v = by_name()["V-d2t-identity"]
    t, d = write_sparse_pair(v, tmp_path)
    specs = dict(sorted(tensor_specs(v).items()))  # in name order, as safetensors writes them: small norms
    sizes = {"F32": 4, "I64": 8, "BOOL": 1}         # just before large projections
    data = {}
    for n, (dt, shape) in specs.items():
        count = 1
        for x in shape:
            count *= x
        data[n] = os.urandom(count * sizes[dt]) if n != "d2t" else bytes(8 * shape[0])
    write_sparse(d / "model.safetensors", specs, data)
    convert(d, t, "vllm", tmp_path / "out", "0.32.0")

    def payload(path):
        header, base = read_header(path)
        raw = path.read_bytes()
        return {n: raw[base + m["data_offsets"][0]:base + m["data_offsets"][1]]
                for n, m in header.items() if n != "__metadata__"}
    before, after = payload(d / "model.safetensors"), payload(tmp_path / "out" / "model.safetensors")
    assert set(before) - set(after) == {"d2t"} and all(after[n] == before[n] for n in after)
