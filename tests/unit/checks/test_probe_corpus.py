"""The doctor against the real engine on the corpus of real public drafters (tests/data/drafters/corpus): every
entry as a header-only pair, the doctor's load verdict equal to the probe's on the real vLLM CPU builds but for
the recorded exclusions, each of which must still be needed.

The realengine tests need the venvs (specdeploy.testing.realengine); the others run anywhere."""
from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest

from specdeploy.testing import drafter_corpus as dc

RELEASES = ("0.16.0", "0.32.0")


def _header(path: Path) -> dict:
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(n))


# --- anywhere ---------------------------------------------------------------------------------------------
def test_every_entry_becomes_a_pair_with_the_published_headers(tmp_path):
    es = dc.entries()
    assert len(es) >= 24
    for e in es:
        t, d, remote = dc.write_pair(e, tmp_path)
        head = {k: (v["dtype"], v["shape"]) for k, v in _header(d / "model.safetensors").items()
                if k != "__metadata__"}
        assert head == {k: (dt, list(shape)) for k, (dt, shape) in e["tensors"].items()}, e["name"]
        assert json.loads((d / "config.json").read_text()) == e["config"]
        cfg = json.loads((t / "config.json").read_text())
        assert remote == bool(cfg.get("auto_map"))
        src = json.loads((dc.target_source(e) / "config.json").read_text())
        # the recorded config; an auto_map (and its class) added only where the recorded one has none
        assert cfg == src or ("auto_map" not in src and {k: v for k, v in cfg.items() if k != "auto_map"} == src)
        assert (d / "model.safetensors").stat().st_blocks * 512 < 8 << 20  # holes: headers and d2t/t2d only


def test_remote_configuration_classes_are_written_where_the_model_ships_one(tmp_path):
    by_type = {}
    for e in dc.entries():
        t, _, remote = dc.write_pair(e, tmp_path)
        cfg = json.loads((t / "config.json").read_text())
        by_type[cfg.get("model_type")] = (t, cfg, remote)
    for mt in ("kimi_k2", "bailing_moe"):
        t, cfg, remote = by_type[mt]
        module, cls = cfg["auto_map"]["AutoConfig"].split(".")
        assert remote and f"class {cls}(" in (t / f"{module}.py").read_text()
        assert f'model_type = "{mt}"' in (t / f"{module}.py").read_text()
    assert by_type["llama"][2] is False and not (by_type["llama"][0] / "configuration_deepseek.py").exists()


def test_exclusions_name_real_entries_and_say_why():
    names = {e["name"] for e in dc.entries()}
    for (name, version), x in dc.EXCLUDED.items():
        assert name in names and version in RELEASES, (name, version)
        assert x.doctor != x.probe and len(x.why) > 80


def test_a_corpus_without_entries_is_a_clean_error(tmp_path):
    from specdeploy.values.errors import SpecdeployError
    with pytest.raises(SpecdeployError) as ei:
        dc.entries(tmp_path)
    assert "no drafter corpus" in str(ei.value)


# --- the real engines -------------------------------------------------------------------------------------
@pytest.mark.realengine
@pytest.mark.parametrize("version", RELEASES)
def test_the_doctor_agrees_with_the_engine_on_the_corpus(tmp_path, version):
    """Every corpus entry, one engine process per release: the doctor's load verdict and predicted aux layers
    equal the engine's, but for the recorded exclusions, which must still differ exactly as recorded."""
    from specdeploy.testing import realengine
    es = dc.entries()
    res, seconds = dc.compare(tmp_path, version, str(Path(realengine.venv(version)) / "bin" / "python"), es,
                              timeout=290)
    assert [o.name for o in res] == [e["name"] for e in es]
    verdicts = {o.name: dc.verdict(o, version) for o in res}
    print("\n" + dc.summary(res, version, seconds))
    for o in res:
        if (o.name, version) in dc.EXCLUDED:
            print(f"  excluded {o.name}: {dc.EXCLUDED[(o.name, version)].why}")
    bad = [f"{o.name}: doctor {sorted(o.doctor)} probe {sorted(o.probe)} (compared {sorted(o.compared)}) taps "
           f"{o.doctor_taps} / {o.probe_taps}" + (" [a recorded exclusion that no longer holds as recorded]"
                                                   if (o.name, version) in dc.EXCLUDED else "")
           for o in res if verdicts[o.name] == "differ"]
    assert not bad, f"{len(bad)} of {len(res)} differ without an explanation:\n" + "\n".join(bad)
    assert sum(v == "agree" for v in verdicts.values()) + sum(k[1] == version for k in dc.EXCLUDED) == len(res)
    assert seconds < 300


# --- every conversion loads whole ---------------------------------------------------------------------------
LOSSY = {"tensor names", "tensor shapes", "missing tensors", "dropped tensors", "drafter load", "d2t",
         "lm_head.weight", "embed_tokens"}


@pytest.mark.realengine
def test_every_vllm_conversion_loads_in_the_engine_with_nothing_dropped(tmp_path):
    """`drafter convert --engine vllm` over every corpus entry it converts for 0.32.0, and over the tiny drafters:
    the real vLLM 0.32.0 loader places every tensor of each output, drops none, misses none, and reshapes none (a
    conversion that would lose trained weights is refused instead; those are counted, not probed). SGLang's
    conversions cannot be probed here (its kernels need CUDA at import)."""
    from specdeploy.checks.probe import case_findings, run_cases
    from specdeploy.drafter import convert
    from specdeploy.testing import realengine, tinymodels
    from specdeploy.values.errors import SpecdeployError
    version = "0.32.0"
    pairs, refused = [], []
    for e in dc.entries():
        t, d, remote = dc.write_pair(e, tmp_path / "in")
        out = tmp_path / "out" / e["name"]
        try:
            convert(d, t, "vllm", out, version)
        except SpecdeployError as exc:
            refused.append((e["name"], str(exc)[:200]))
            continue
        pairs.append((e["name"], t, out, remote))
    for kind in ("llama", "deepseek_v3", "kimi_k2"):
        t, d = tinymodels.target(kind), tinymodels.drafter(kind, "good")
        out = tmp_path / "out" / f"tiny-{kind}"
        convert(d, t, "vllm", out, version)
        pairs.append((f"tiny-{kind}", t, out, kind == "kimi_k2"))
    assert len(pairs) >= 20, refused  # most of the corpus converts
    cases = [{"id": n, "target": str(t), "drafter": str(o), "trust_remote_code": r, "num_speculative_tokens": 1}
             for n, t, o, r in pairs]
    run = run_cases("vllm", version, cases, str(realengine.venv(version) / "bin" / "python"), timeout=540)
    assert run.ran, run.why
    lost, probed = {}, 0
    for n, *_ in pairs:
        c = run.cases[n]
        if not c.get("load"):  # the engine stopped before its loader (the target's class, not the conversion)
            continue
        probed += 1
        bad = [f"{f.subject}: {f.message}" for f in case_findings(c, "vllm", version)
               if f.subject in LOSSY and f.severity in ("error", "warning")]
        if (n, version) in dc.EXCLUDED:  # recorded: a parameter the engine builds in every layer, used in layer 0
            bad = [b for b in bad if not re.fullmatch(r"missing tensors: .*: model\.layers\.[1-9]\d*\.hidden_norm"
                                                      r"\.weight", b)]
        if bad or c["load"].get("dropped") or c["load"].get("narrowed"):
            lost[n] = bad or c["load"]
    assert not lost, lost
    assert probed >= len(pairs) - 2, (probed, len(pairs))  # only the excluded target classes stop earlier
