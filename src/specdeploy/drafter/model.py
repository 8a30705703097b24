"""The drafter as the doctor sees it: its config, format and checkpoint tensor names and shapes (never the
weights), the target's end-of-turn tokens, and the aux-layer taps trained and captured.

Aux-layer numbering: vLLM and speculators number a tap L as the input of layer L and read the top-level
``eagle_aux_hidden_state_layer_ids``; SGLang, SpecForge and TorchSpec number it as the output of layer L
(vLLM id - 1) and read ``eagle_config.eagle_aux_hidden_state_layer_ids``. Internally taps are vLLM numbers.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from specdeploy.engines import UnsupportedVersion, get, get_adapter, names
from specdeploy.values.errors import Finding, SpecdeployError
from specdeploy.values.hostpaths import CONVERSION_RECORD
from specdeploy.checkpoint.modelcfg import TargetModel, load_json
from specdeploy.checkpoint.safetensors_io import SafetensorsError, TensorInfo, bin_only, checkpoint_tensors

META_FILE = CONVERSION_RECORD  # values/hostpaths.py names it (the drafter role looks for it)
CONVERT = "run `specdeploy drafter convert --engine {engine}`"
LAYER_RE = re.compile(r"^(?:layers\.(\d+)|midlayer)\.")
EOT_RE = re.compile(r"im_end|eot|end_of_turn|<\|end\|>|<\|return\|>|<\|call\|>|eom_id|end_of_message", re.IGNORECASE)


def is_convertible(f: Finding) -> bool:
    """Findings that `drafter convert` fixes (the drafter role converts before the engine starts)."""
    return f.fix.startswith("run `specdeploy drafter convert")


def _unknown_engine(engine: str) -> Finding:
    return Finding("error", "--engine", f"unknown engine '{engine}'", f"use {' or '.join(names())}")


def resolve_version(engine: str, version: str | None) -> str:
    try:
        versions = get(engine).versions
    except UnsupportedVersion:
        raise SpecdeployError([_unknown_engine(engine)]) from None
    if version is None:
        return versions[-1]
    if version not in versions:
        raise SpecdeployError([Finding("error", "--engine-version", f"{engine} {version} is not a version "
                                       "specdeploy knows", f"use one of {', '.join(versions)}")])
    return version


@dataclass
class Drafter:
    path: Path
    config: dict
    fmt: str  # llama | speculators | mla | unknown
    layer: dict  # the decoder-layer config
    tensors: dict[str, TensorInfo]
    bin_files: list[str]
    raw_tensors: dict[str, TensorInfo] | None = None  # the names as the checkpoint spells them

    @classmethod
    def load(cls, path: Path) -> Drafter:
        cfg = load_json(path / "config.json", "drafter config.json")
        if not isinstance(cfg, dict):
            raise SpecdeployError([Finding("error", "drafter config.json", f"{path / 'config.json'} is not a "
                                           "JSON object", "restore the drafter's config.json")])
        raw_archs = cfg.get("architectures")
        if raw_archs is not None and not isinstance(raw_archs, list):
            raise SpecdeployError([Finding("error", "drafter config.json architectures", f"{path / 'config.json'}: "
                                           f"architectures is a {type(raw_archs).__name__}, not a list",
                                           "restore the drafter's config.json")])
        archs = [a for a in (raw_archs or []) if isinstance(a, str)]
        if cfg.get("speculators_model_type") == "eagle3":
            tlc = cfg.get("transformer_layer_config")
            fmt, layer = "speculators", dict(tlc) if isinstance(tlc, dict) else {}
        elif any("Deepseek" in a and "Eagle3" in a for a in archs):
            fmt, layer = "mla", cfg
        elif archs:
            # the engine resolves any architecture (vLLM: X -> Eagle3X) and its registry decides; the Llama-style
            # head is the flat config's shape (rules._check_format names an architecture no release registers)
            fmt, layer = "llama", cfg
        else:
            fmt, layer = "unknown", cfg
        try:
            ts = checkpoint_tensors(path)
        except SafetensorsError as exc:
            raise SpecdeployError([Finding("error", "safetensors", str(exc),
                                           "re-download or re-export the drafter checkpoint")]) from None
        # names without a leading "model." (the checks that need the checkpoint's own spelling read raw_tensors:
        # vLLM's EAGLE-3 loader prepends "model." itself and keeps one the checkpoint has)
        raw = dict(ts)
        ts = {n.removeprefix("model."): t for n, t in ts.items()}
        return cls(path, cfg, fmt, layer, ts, bin_only(path), raw)

    def _int(self, key: str, *sources) -> int:
        for src in sources:
            v = src.get(key)
            if isinstance(v, int) and not isinstance(v, bool):
                return v
        return 0

    @property
    def hidden(self) -> int:
        return self._int("hidden_size", self.layer, self.config)

    @property
    def target_hidden(self) -> int:
        return self._int("target_hidden_size", self.config, self.layer) or self.hidden

    @property
    def vocab(self) -> int:
        return self._int("vocab_size", self.layer, self.config)

    @property
    def draft_vocab(self) -> int:
        return self._int("draft_vocab_size", self.config, self.layer) or self.vocab

    @property
    def declares_draft_vocab(self) -> bool:
        return isinstance(self.config.get("draft_vocab_size") or self.layer.get("draft_vocab_size"), int)

    @property
    def num_layers(self) -> int:
        return self._int("num_hidden_layers", self.layer) or 1

    @property
    def heads(self) -> int:
        return self._int("num_attention_heads", self.layer)

    @property
    def head_dim(self) -> int:
        return self._int("head_dim", self.layer) or (self.hidden // self.heads if self.heads else 0)

    def tensor_layers(self) -> set[int]:
        out = set()
        for n in self.tensors:
            m = LAYER_RE.match(n)
            if m:
                out.add(int(m.group(1) or 0))
        return out

    def top_aux(self):
        return self.config.get("eagle_aux_hidden_state_layer_ids")

    def nested_aux(self):
        ec = self.config.get("eagle_config")
        return ec.get("eagle_aux_hidden_state_layer_ids") if isinstance(ec, dict) else None

    def norm_before_residual(self, engine: str) -> bool:
        """The value the engine runs with (a speculators config without the key: the speculators loader's
        default, as the engine's table records it; True where it records none)."""
        if "norm_before_residual" in self.config:
            return bool(self.config["norm_before_residual"])
        return self.fmt == "speculators" and get(engine).DRAFTER.get("speculators_norm_before_residual_default", True)


def default_aux(layers: int) -> list[int]:
    return [2, layers // 2, layers - 3]


def _ids_ok(ids) -> bool:
    return isinstance(ids, list) and len(ids) == 3 and all(isinstance(i, int) and not isinstance(i, bool)
                                                            for i in ids)


def end_of_turn_ids(t: TargetModel) -> tuple[set[int], dict[int, str]]:
    """(end-of-turn token ids of the chat template, names of the target's special tokens) as far as the
    target's tokenizer_config.json tells; empty when the target directory carries no tokenizer files."""
    names: dict[int, str] = {}
    template = ""
    tc = t.path / "tokenizer_config.json"
    if tc.is_file():
        try:
            data = json.loads(tc.read_text())
            for k, v in (data.get("added_tokens_decoder") or {}).items():
                if isinstance(v, dict) and isinstance(v.get("content"), str) and str(k).isdigit():
                    names[int(k)] = v["content"]
            ct = data.get("chat_template")
            template = ct if isinstance(ct, str) else ""
        except (ValueError, AttributeError, UnicodeDecodeError):
            pass
    jinja = t.path / "chat_template.jinja"
    if jinja.is_file():
        template += jinja.read_text(errors="replace")
    eot = {i for i, n in names.items() if EOT_RE.search(n) and (not template or n in template)}
    return eot, names



# --- aux layers -------------------------------------------------------------------------------------------
def trained_taps(d: Drafter) -> tuple[list[int] | None, str]:
    """The taps the drafter was trained on, in vLLM numbering, and where they were read."""
    top, nested = d.top_aux(), d.nested_aux()
    if _ids_ok(top):
        return list(top), "top-level eagle_aux_hidden_state_layer_ids (vLLM numbering)"
    if _ids_ok(nested):
        return [x + 1 for x in nested], "eagle_config.eagle_aux_hidden_state_layer_ids (SGLang numbering)"
    v2 = _v2_layer_ids(d)
    if v2 is not None:
        return v2, "eagle_config.layer_ids (vLLM V2 numbering)"
    return None, "no aux ids in the config"


def target_traits(t: TargetModel) -> tuple[bool, bool, bool]:
    """(MoE, quantized, hybrid) as vLLM's ModelConfig tells them apart (experts in the text config, a
    quantization_config, layers that are not all attention)."""
    moe = any(isinstance(t.text.get(k), int) and not isinstance(t.text.get(k), bool) and t.text.get(k) > 0
              for k in ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts"))
    quantized = isinstance(t.config.get("quantization_config") or t.text.get("quantization_config"), dict)
    kinds = t.text.get("layer_types") or t.text.get("layers_block_type") or []
    hybrid = bool(t.text.get("hybrid_override_pattern")) or (isinstance(kinds, list) and any(
        isinstance(k, str) and not k.endswith("attention") for k in kinds))
    return moe, quantized, hybrid


def model_runner(t: TargetModel, engine: str, version: str, runner: str | None = None) -> tuple[str | None, str]:
    """The model runner that serves this target ("v1"/"v2"; "" where the engine has one runner), and why; None
    where the release's default was not read."""
    a = get_adapter(engine, version)
    if not getattr(a, "model_runners", ()):
        return "", ""
    return a.model_runner(t.architectures, *target_traits(t), runner=runner)


def _v2_layer_ids(d: Drafter):
    ec = d.config.get("eagle_config")
    ids = ec.get("layer_ids") if isinstance(ec, dict) else None
    return list(ids) if _ids_ok(ids) else None


def engine_taps(d: Drafter, t: TargetModel, engine: str, version: str,
                runner: str | None = None) -> tuple[list[int] | None, str]:
    """The taps (vLLM numbering) the engine version captures for this config, on ``runner`` (None: the release's
    default for this target); None when not pinned down."""
    top, nested = d.top_aux(), d.nested_aux()
    a = get_adapter(engine, version)
    run, why = model_runner(t, engine, version, runner)
    v1 = a.drafter_taps(top if _ids_ok(top) else None, nested if _ids_ok(nested) else None, default_aux(t.layers),
                        t.is_kimi_or_deepseek)
    if run == "":
        return v1
    v2 = a.drafter_taps_v2(top if _ids_ok(top) else None, _v2_layer_ids(d), default_aux(t.layers)) \
        if a.DRAFTER.get("v2_eagle3") and a.DRAFTER["v2_eagle3"].contains(version) else None
    if run == "v2" and v2 is not None:
        return v2
    if run == "v1" or v2 is None or v1[0] == v2[0]:
        return v1
    return None, f"{why}; V1 captures {v1[0]} ({v1[1]}), V2 {v2[0]} ({v2[1]})"
