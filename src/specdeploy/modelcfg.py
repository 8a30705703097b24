"""Facts about a target model read from its config files (and safetensors headers when present)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import Finding, SpecdeployError
from .safetensors_io import DTYPE_BYTES, SafetensorsError, checkpoint_tensors


def load_json(path: Path, subject: str) -> dict:
    if not path.is_file():
        raise SpecdeployError([Finding("error", subject, f"{path} does not exist",
                                       "point the path at a directory holding config.json")])
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SpecdeployError([Finding("error", subject, f"{path} is not valid JSON: {exc}",
                                       "fix or re-download the file")]) from None


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
        gen = load_json(gen_path, "generation_config.json") if gen_path.is_file() else {}
        return cls(path, cfg, cfg.get("text_config", cfg), gen)

    @property
    def model_type(self) -> str:
        return self.config.get("model_type", "")

    @property
    def text_model_type(self) -> str:
        return self.text.get("model_type", "")

    @property
    def architectures(self) -> list[str]:
        return list(self.config.get("architectures") or [])

    @property
    def hidden(self) -> int:
        return int(self.text["hidden_size"])

    @property
    def layers(self) -> int:
        return int(self.text["num_hidden_layers"])

    @property
    def vocab(self) -> int:
        return int(self.text["vocab_size"])

    @property
    def heads(self) -> int:
        return int(self.text["num_attention_heads"])

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
            if isinstance(v, int):
                ids.add(v)
            elif isinstance(v, list):
                ids.update(int(x) for x in v)
        return ids

    def weight_bytes(self) -> tuple[int, str]:
        """(bytes, how it was sized): safetensors index, then headers, then an estimate from the config."""
        idx = self.path / "model.safetensors.index.json"
        if idx.is_file():
            total = load_json(idx, "model.safetensors.index.json").get("metadata", {}).get("total_size")
            if total:
                return int(total), "safetensors index"
        try:
            ts = checkpoint_tensors(self.path)
        except SafetensorsError:
            ts = {}
        if ts:
            return sum(t.nbytes for t in ts.values()), "safetensors headers"
        return self.estimate_bytes(), "estimate from config.json"

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
