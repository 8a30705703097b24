"""Facts about a target model read from its config files (and safetensors headers when present)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specdeploy.values.errors import Finding, SpecdeployError
from specdeploy.checkpoint.safetensors_io import DTYPE_BYTES, SafetensorsError, checkpoint_tensors


def load_json(path: Path, subject: str) -> dict:
    """A config file as a JSON object; anything else (missing, not a regular file, larger than
    ``bounded.MAX_CONFIG``, nested deeper than ``bounded.MAX_DEPTH``, not UTF-8, not JSON, not an object) is a
    finding that names the file. A FIFO or device is refused without blocking on it."""
    from specdeploy.values.bounded import Refused, loads, read_regular
    fix = "fix or re-download the file"
    if not path.parent.is_dir():
        what = "is not a directory" if path.parent.exists() else "does not exist"
        raise SpecdeployError([Finding("error", subject, f"{path.parent} {what}",
                                       "point the path at a directory holding config.json")])
    if not path.is_file():
        what = "is not a regular file" if path.exists() else "does not exist"
        raise SpecdeployError([Finding("error", subject, f"{path} {what}",
                                       "point the path at a directory holding config.json")])
    try:
        data = loads(read_regular(path))
    except UnicodeDecodeError:
        raise SpecdeployError([Finding("error", subject, f"{path} is not UTF-8 text", fix)]) from None
    except json.JSONDecodeError as exc:
        raise SpecdeployError([Finding("error", subject, f"{path} is not valid JSON: {exc}", fix)]) from None
    except Refused as exc:
        raise SpecdeployError([Finding("error", subject, f"{path} {exc}", fix)]) from None
    except OSError as exc:
        raise SpecdeployError([Finding("error", subject, f"{path} cannot be read ({exc.strerror or exc})",
                                       "make it readable")]) from None
    if not isinstance(data, dict):
        raise SpecdeployError([Finding("error", subject, f"{path} holds a JSON {type(data).__name__}, not an "
                                       "object", fix)])
    return data


def local_config_dir(candidates, base: Path | None) -> Path | None:
    """The first of ``candidates`` (paths, relative ones under ``base``, the inventory's directory) that holds a
    config.json on this machine: the controller-side copy of a checkpoint's configuration preflight and the plan
    read."""
    for cand in candidates:
        if not cand:
            continue
        p = Path(cand)
        p = base / p if not p.is_absolute() and base is not None else p
        if (p / "config.json").is_file():
            return p
    return None


# the largest value of a config's sizes any real model has, with room to spare: a config beyond it is refused
# before anything loops over its layers or sizes its tensors
BOUNDS = {"hidden_size": 1 << 20, "num_hidden_layers": 10_000, "vocab_size": 1 << 24, "num_attention_heads": 1 << 14}


def _positive_int(src: dict, key: str, path: Path) -> int:
    v = src.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise SpecdeployError([Finding("error", f"target config.json {key}", f"{path / 'config.json'}: {key} is "
                                       f"{v!r}, not a positive integer", "restore the model's config.json")])
    if v > BOUNDS.get(key, v):
        raise SpecdeployError([Finding("error", f"target config.json {key}", f"{path / 'config.json'}: {key} is "
                                       f"{v}, beyond any real model (at most {BOUNDS[key]:,})",
                                       "restore the model's config.json")])
    return v


@dataclass
class TargetModel:
    path: Path
    config: dict
    text: dict
    generation: dict

    @classmethod
    def load(cls, path: Path) -> "TargetModel":
        cfg = load_json(path / "config.json", "target config.json")
        gen_path = path / "generation_config.json"
        gen = load_json(gen_path, "generation_config.json") if gen_path.exists() or gen_path.is_symlink() else {}
        text = cfg.get("text_config", cfg)
        if not isinstance(text, dict):
            raise SpecdeployError([Finding("error", "target config.json text_config", f"{path / 'config.json'}: "
                                           f"text_config is a {type(text).__name__}, not an object",
                                           "restore the model's config.json")])
        for key in ("model_type", "architectures", "quantization_config", "auto_map"):
            for src in (cfg, text):
                v = src.get(key)
                ok = {"model_type": str, "architectures": list, "quantization_config": dict, "auto_map": dict}[key]
                if v is not None and not isinstance(v, ok):
                    raise SpecdeployError([Finding("error", f"target config.json {key}", f"{path / 'config.json'}:"
                                                   f" {key} is a {type(v).__name__}, not a {ok.__name__}",
                                                   "restore the model's config.json")])
        for key in ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads"):
            if key in text:
                _positive_int(text, key, path)
        for src, name in ((cfg, "config.json"), (text, "config.json"), (gen, "generation_config.json")):
            v = src.get("eos_token_id")
            ints = [v] if not isinstance(v, list) else v
            if v is not None and not all(isinstance(x, int) and not isinstance(x, bool) for x in ints):
                raise SpecdeployError([Finding("error", f"{name} eos_token_id", f"{path / name}: eos_token_id is "
                                               f"{v!r}, not a token id or a list of them",
                                               "restore the model's config files")])
        return cls(path, cfg, text, gen)

    @property
    def model_type(self) -> str:
        return self.config.get("model_type", "")

    @property
    def text_model_type(self) -> str:
        return self.text.get("model_type", "")

    @property
    def architectures(self) -> list[str]:
        return [a for a in self.config.get("architectures") or [] if isinstance(a, str)]

    @property
    def hidden(self) -> int:
        return _positive_int(self.text, "hidden_size", self.path)

    @property
    def layers(self) -> int:
        return _positive_int(self.text, "num_hidden_layers", self.path)

    @property
    def vocab(self) -> int:
        return _positive_int(self.text, "vocab_size", self.path)

    @property
    def heads(self) -> int:
        return _positive_int(self.text, "num_attention_heads", self.path)

    @property
    def is_kimi_or_deepseek(self) -> bool:
        kinds = {self.model_type, self.text_model_type}
        return bool(kinds & {"kimi_k25", "kimi_k2", "deepseek_v2", "deepseek_v3"})

    @property
    def needs_remote_code(self) -> bool:
        return bool(self.config.get("auto_map")) or self.model_type in {"kimi_k25", "kimi_k2"}

    def eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for src in (self.generation, self.text, self.config):
            v = src.get("eos_token_id")
            if isinstance(v, int) and not isinstance(v, bool):
                ids.add(v)
            elif isinstance(v, list):
                ids.update(x for x in v if isinstance(x, int) and not isinstance(x, bool))
        return ids

    def weight_bytes(self) -> tuple[int, str]:
        """(bytes, how it was sized): safetensors index, then headers, then an estimate from the config."""
        idx = self.path / "model.safetensors.index.json"
        if idx.is_file():
            meta = load_json(idx, "model.safetensors.index.json").get("metadata")
            total = meta.get("total_size") if isinstance(meta, dict) else None
            if isinstance(total, int) and not isinstance(total, bool) and total > 0:
                return total, "safetensors index"
        try:
            ts = checkpoint_tensors(self.path)
        except SafetensorsError:
            ts = {}
        if ts:
            return sum(t.nbytes for t in ts.values()), "safetensors headers"
        try:
            return self.estimate_bytes(), "estimate from config.json"
        except (TypeError, ValueError, AttributeError, OverflowError, ZeroDivisionError) as exc:
            raise SpecdeployError([Finding("error", "target config.json", f"{self.path / 'config.json'}: cannot "
                                           f"size the weights from it ({type(exc).__name__}: {exc})",
                                           "restore the model's config.json, or add model.safetensors.index.json")
                                   ]) from None

    def estimate_bytes(self) -> int:
        t = self.text
        h, n = self.hidden, self.layers
        vocab = self.vocab
        heads = self.heads
        q_lora, kv_lora = t.get("q_lora_rank") or 0, t.get("kv_lora_rank") or 0
        nope, rope, vdim = t.get("qk_nope_head_dim", 128), t.get("qk_rope_head_dim", 64), t.get("v_head_dim", 128)
        if kv_lora:
            attn = (h * q_lora + q_lora * heads * (nope + rope) if q_lora else h * heads * (nope + rope))
            attn += h * (kv_lora + rope) + kv_lora * heads * (nope + vdim) + heads * vdim * h
        else:
            kvh = t.get("num_key_value_heads", heads)
            hd = t.get("head_dim", h // heads)
            attn = h * heads * hd * 2 + h * kvh * hd * 2
        dense_ffn = 3 * h * t.get("intermediate_size", 4 * h)
        experts = t.get("n_routed_experts") or 0
        moe_ffn = 3 * h * t.get("moe_intermediate_size", 0) * (experts + (t.get("n_shared_experts") or 0))
        k_dense = t.get("first_k_dense_replace", n if not experts else 0)
        ffn_params_dense = dense_ffn * k_dense
        ffn_params_moe = moe_ffn * (n - k_dense)
        emb = 2 * vocab * h
        q = t.get("quantization_config") or self.config.get("quantization_config") or {}
        bits = 16
        for g in (q.get("config_groups") or {}).values():
            bits = min(bits, int(g.get("weights", {}).get("num_bits", 16)))
        if q.get("quant_method") == "fp8":
            bits = 8
        # Quantized checkpoints quantize the routed experts; attention, dense layers and embeddings stay bf16.
        expert_bytes = ffn_params_moe * bits / 8 * (1 + (2 / 32 if bits < 16 else 0))  # + group scales
        other = (attn * n + ffn_params_dense + emb) * DTYPE_BYTES["BF16"]
        return int(expert_bytes + other)
