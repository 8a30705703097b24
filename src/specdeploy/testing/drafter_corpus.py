"""The corpus of real public drafters (``tests/data/drafters/corpus/*.json``) as (target dir, drafter dir) pairs the
engine probe and the doctor both read.

Each entry holds a drafter's config.json, its checkpoint's tensor names with their dtypes and shapes as
published, the forced and excluded ids of its draft vocabulary, and the directory of its target's config. A pair
is written as:

- the drafter: its config.json and one header-only sparse safetensors with exactly the recorded tensors (the
  weights are holes; the probe reads only headers); ``d2t``/``t2d`` hold a draft vocabulary with the forced ids
  and none of the excluded ones;
- the target: a copy of the recorded target directory (config.json, generation and tokenizer configs), and, where
  the published model's configuration class is remote code (``auto_map``), that class as the published repository
  ships it, so the engine reads the config with ``trust_remote_code`` as a real deploy does.

``EXCLUDED`` names the pairs whose doctor-versus-probe difference lies outside what the probe can judge, each with
its reason; ``compare`` runs both over every entry with one engine process per release.

    python -m specdeploy.testing.drafter_corpus 0.32.0 --venv DIR     # prints the agreement
"""
from __future__ import annotations

import json
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

from specdeploy.checkpoint.safetensors_io import write_sparse
from specdeploy.values.errors import Finding, SpecdeployError

DATA = Path(__file__).resolve().parents[3] / "tests" / "data" / "drafters"

# A published configuration class (the repository's auto_map file) per target model type that transformers and
# the engine may not know. The class is the published one's stand-in: its model type over the library class it
# extends (Kimi-K2's configuration_deepseek.py is DeepSeek-V3's config under model_type kimi_k2; Ling-flash-2.0's
# configuration_bailing_moe_v2.py a plain PretrainedConfig under model_type bailing_moe). The probe reads the
# config's sizes, never builds the target.
REMOTE_CONFIG = {
    "kimi_k2": ("configuration_deepseek", "DeepseekV3Config",
                "from transformers import DeepseekV3Config as _Base\n\n\n"
                "class DeepseekV3Config(_Base):\n    model_type = \"kimi_k2\"\n"),
    "bailing_moe": ("configuration_bailing_moe_v2", "BailingMoeV2Config",
                    "from transformers import PretrainedConfig\n\n\n"
                    "class BailingMoeV2Config(PretrainedConfig):\n    model_type = \"bailing_moe\"\n"),
}


def entries(data: Path = DATA) -> list[dict]:
    """Every corpus entry, by file name."""
    files = sorted((Path(data) / "corpus").glob("*.json"))
    if not files:
        raise SpecdeployError([Finding("error", "corpus", f"no drafter corpus under {data}/corpus",
                                       "run from a specdeploy checkout (tests/data/drafters/corpus)")])
    return [json.loads(f.read_text()) for f in files]


def target_source(entry: dict, data: Path = DATA) -> Path:
    """The recorded target directory: ``targets/...`` under the corpus data, else a path from the repo root."""
    t = entry["target"]
    return Path(data) / t if t.startswith("targets/") else Path(data).parents[2] / t


def write_drafter(entry: dict, path: Path) -> Path:
    """A sparse checkpoint with the recorded names, dtypes and shapes; d2t/t2d from a draft vocabulary holding the
    recorded forced ids and none of the excluded ones."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(entry["config"], indent=1))
    specs = {n: (dt, tuple(shape)) for n, (dt, shape) in entry["tensors"].items()}
    data = {}
    if "d2t" in specs and entry.get("d2t"):
        dv = specs["d2t"][1][0]
        vocab = entry["config"].get("vocab_size") or entry["config"]["transformer_layer_config"]["vocab_size"]
        force, exclude = set(entry["d2t"]["force"]), set(entry["d2t"]["exclude"])
        rest = [i for i in range(dv + len(exclude) + len(force)) if i not in exclude and i not in force]
        sel = sorted(force | set(rest[:dv - len(force)]))
        if len(sel) != dv:
            raise SpecdeployError([Finding("error", "corpus", f"{entry['name']}: d2t of {dv} rows cannot hold the "
                                           f"{len(force)} forced ids", "fix the entry's d2t.force")])
        data["d2t"] = struct.pack(f"<{dv}q", *[t - i for i, t in enumerate(sel)])
        if "t2d" in specs:
            mask = bytearray(vocab)
            for t in sel:
                mask[t] = 1
            data["t2d"] = bytes(mask)
    write_sparse(path / "model.safetensors", specs, data)
    return path


def write_target(entry: dict, path: Path, data: Path = DATA) -> tuple[Path, bool]:
    """A copy of the entry's target directory with its remote configuration class where the published model has
    one; (the directory, whether the engine must trust remote code for it)."""
    if (path / "config.json").is_file():
        return path, bool(json.loads((path / "config.json").read_text()).get("auto_map"))
    src = target_source(entry, data)
    if not (src / "config.json").is_file():
        raise SpecdeployError([Finding("error", "corpus", f"{entry['name']}: no config.json in its target {src}",
                                       "fix the entry's target")])
    path.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file():
            shutil.copy(f, path / f.name)
    cfg = json.loads((src / "config.json").read_text())
    mt = cfg.get("model_type")
    if mt in REMOTE_CONFIG and "auto_map" not in cfg:
        module, cls, text = REMOTE_CONFIG[mt]
        cfg["auto_map"] = {"AutoConfig": f"{module}.{cls}"}
        (path / f"{module}.py").write_text(text)
        (path / "config.json").write_text(json.dumps(cfg, indent=1))
    return path, bool(cfg.get("auto_map"))


def write_pair(entry: dict, root: Path, data: Path = DATA) -> tuple[Path, Path, bool]:
    """(target dir, drafter dir, trust_remote_code) of a corpus entry, written under ``root`` (targets shared)."""
    key = entry["target"].strip("/").replace("/", "_")
    t, remote = write_target(entry, Path(root) / "targets" / key, data)
    d = write_drafter(entry, Path(root) / "drafters" / entry["name"])
    return t, d, remote


# --- the doctor against the engine ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Exclusion:
    """A recorded difference between the doctor and the probe on one entry and release, with the classes each
    gives (so an exclusion that no longer holds, in either direction, shows) and why the probe's answer is not
    the engine's verdict on what the doctor judges."""

    doctor: frozenset
    probe: frozenset
    why: str


_NO_TORCHVISION = Exclusion(frozenset(), frozenset({"config"}), (
    "the probe cannot import the target's class on this CPU build: vLLM's mllama4.py (Llama4ForConditional"
    "Generation) imports transformers' Llama-4 image processor (image_processing_llama4, _fast in 0.16), which "
    "imports torchvision, and the CPU venv has none, so ModelConfig stops at 'failed to be inspected' before "
    "the drafter is judged"))
EXCLUDED: dict[tuple[str, str], Exclusion] = {
    ("specforge-llama4-scout-17b-16e-eagle3", "0.16.0"): _NO_TORCHVISION,
    ("specforge-llama4-scout-17b-16e-eagle3", "0.32.0"): _NO_TORCHVISION,
    ("kimi-k2.5-eagle3-mla-2-layers", "0.32.0"): Exclusion(frozenset(), frozenset({"missing"}), (
        "the probe counts model.layers.1.hidden_norm.weight as missing: deepseek_eagle3.py builds hidden_norm "
        "in every decoder layer but only layer 0 calls it (_residual_norm runs for layer_idx 0 alone), so the "
        "checkpoint's layer 1 without it serves; the probe sees parameters, not which ones forward reads")),
}


def verdict(o, version: str) -> str:
    """'agree', 'excluded' (the recorded difference, as recorded) or 'differ' for an outcome on ``version``."""
    x = EXCLUDED.get((o.name, version))
    if x is None:
        return "agree" if o.agree else "differ"
    same = (o.doctor & o.compared) == set(x.doctor) and (o.probe & o.compared) == set(x.probe)
    return "excluded" if same and not o.agree else "differ"


def compare(root: Path, version: str, python: str, items: list[dict] | None = None, timeout: float = 600.0):
    """The doctor and the probe over every corpus entry (one engine process); (outcomes, probe seconds)."""
    from specdeploy.testing.drafter_variants import compare_pairs
    items = entries() if items is None else items
    pairs = [(e["name"], *write_pair(e, root)) for e in items]
    return compare_pairs(pairs, version, python, timeout)


def main(argv=None):
    import argparse
    import tempfile
    ap = argparse.ArgumentParser(prog="python -m specdeploy.testing.drafter_corpus")
    ap.add_argument("version")
    ap.add_argument("--venv", required=True)
    ap.add_argument("--show", action="store_true", help="print every entry, not only disagreements")
    a = ap.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            res, secs = compare(Path(tmp), a.version, str(Path(a.venv) / "bin" / "python"))
    except SpecdeployError as exc:
        print(exc)
        return 2
    for o in res:
        v = verdict(o, a.version)
        x = EXCLUDED.get((o.name, a.version))
        if a.show or v != "agree":
            print(f"{v:8} {o.name}: doctor {sorted(o.doctor)} probe {sorted(o.probe)} (compared "
                  f"{sorted(o.compared)}) taps doctor {o.doctor_taps} probe {o.probe_taps}"
                  + (f"\n         {x.why}" if x else ""))
            if v == "differ":
                for p in (o.raw or {}).get("problems", []):
                    print(f"         {p.get('stage')}: {str(p.get('error', ''))[:400]}")
    print(summary(res, a.version, secs))
    return 0


def summary(res, version: str, seconds: float) -> str:
    n = {k: sum(verdict(o, version) == k for o in res) for k in ("agree", "excluded", "differ")}
    return (f"vLLM {version}: {n['agree']} agree of {len(res)} corpus entries, {n['excluded']} explained "
            f"exclusion(s), {n['differ']} unexplained ({seconds:.0f} s probe)")


if __name__ == "__main__":
    raise SystemExit(main())
