"""Tiny, deterministic, locally generated models for the real engines (tests and the sandbox only; nothing is
downloaded).

    from specdeploy.testing import tinymodels
    tinymodels.target("kimi_k2")             # -> Path of a model directory vLLM serves
    tinymodels.drafter("kimi_k2", "good")    # -> Path of an EAGLE-3 drafter for that target
    tinymodels.meta(path)                    # -> what the generator recorded (successor table, special tokens)
    tinymodels.text_config("deepseek_v3")    # -> the shapes, without building anything

Targets (``KINDS``), each with a byte-level BPE tokenizer trained locally (``tokenizer.json``,
``tokenizer_config.json`` with a chat template, ``special_tokens_map.json``) and ``generation_config.json``:

- ``llama``: ``LlamaForCausalLM``, hidden 256, 4 layers, float32;
- ``deepseek_v3``: ``DeepseekV3ForCausalLM`` (MLA + MoE), bfloat16, ``kv_lora_rank + qk_rope_head_dim = 576``
  (what vLLM's CPU MLA backend accepts), 8 routed experts, 1 shared, the first layer dense;
- ``kimi_k2``: the same shapes with ``model_type: kimi_k2`` and, as the published checkpoint does, its own config
  class (``configuration_kimi_k2.py`` by ``auto_map``): releases that do not register ``kimi_k2`` read it only
  with ``--trust-remote-code``;
- ``kimi_k25``: a ``KimiK25ForConditionalGeneration`` wrapper (``model_type: kimi_k25``, a small
  ``vision_config``, ``media_placeholder_token_id``) whose ``text_config`` is the ``kimi_k2`` one; it carries
  the language model's weights under ``language_model.`` and no vision weights or image processor (a config-only
  wrapper: vLLM 0.16.0 asks for its image processor, ``preprocessor_config.json``, once past the speculative
  config, and stops there).

Every target's greedy next token depends only on the current token: ``meta(target)["successor"][x]`` is the
token the target answers to ``x`` (one cycle over the regular tokens). Drafters (``QUALITIES``), in the flat
EAGLE-3 layout exporters write (``LlamaForCausalLMEagle3``, ``draft_vocab_size`` over the regular tokens and
``<|im_end|>`` with ``d2t``/``t2d``, aux layer ids at the top level in vLLM numbering and under ``eagle_config``
in SGLang numbering):

- ``good``: shares the target's embedding and predicts the target's token after next from the first aux tap, so
  an engine accepts its first draft token every time (later positions of a draft are not predicted; vLLM 0.32.0
  on CPU, llama target, 3 speculative tokens, greedy: 20 of 20 drafts accepted at position 0, none later);
- ``random``: random weights: an engine accepts next to none of its drafts (the same setup: 0 of 117 draft
  tokens).

Each artifact is built once into ``$SPECDEPLOY_CACHE/tinymodels-<kind>-<key16>`` (default
``/var/cache/specdeploy``), keyed by its spec, the generator's source and the venv that runs it (the vLLM 0.32.0
real-engine venv: torch, tokenizers, safetensors); built beside its place and renamed in, under a lock.

    python -m specdeploy.testing.tinymodels build kimi_k25 [--drafter good]   # prints the paths
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

from specdeploy.values.errors import Finding, SpecdeployError
from specdeploy.testing import cache, realengine

CACHE = Path(os.environ.get("SPECDEPLOY_CACHE", "/var/cache/specdeploy"))
LOCK = CACHE / "tinymodels.lock"
GENERATOR = Path(__file__).with_name("tinygen.py")
VENV_VERSION = "0.32.0"  # the venv whose Python writes the artifacts
KINDS = ("llama", "deepseek_v3", "kimi_k2", "kimi_k25")
QUALITIES = ("good", "random")
VOCAB = 512
# 8 attention heads everywhere: the rendered command of an 8-GPU host (--tensor-parallel-size 8) passes the
# engine's head-divisibility checks, so the engine goes on to the checks these models are for.
MAX_POSITIONS = 262144  # Kimi's: a rendered --max-model-len of 131072 fits

# Special tokens, in id order (ids 0..7): Kimi's names, the media placeholder included.
SPECIALS = ("[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
            "<|media_pad|>")
ROLES = {"bos": "[BOS]", "eos": "[EOS]", "pad": "[EOS]"}
DRAFT_SPECIALS = ("<|im_end|>",)  # the special tokens a drafter's vocabulary keeps: the end of a turn
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}<|im_system|>system<|im_middle|>"
    "{%- elif message['role'] == 'user' -%}<|im_user|>user<|im_middle|>"
    "{%- else -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
    "{{ message['content'] }}<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}")

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
         "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
         "head_dim": 64, "hidden_act": "silu", "vocab_size": VOCAB, "max_position_embeddings": 8192,
         "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "attention_bias": False, "mlp_bias": False,
         "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 2, "torch_dtype": "float32"}
DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 256,
               "intermediate_size": 512, "moe_intermediate_size": 128, "num_hidden_layers": 4,
               "num_attention_heads": 8, "num_key_value_heads": 8, "n_routed_experts": 8, "n_shared_experts": 1,
               "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc",
               "scoring_func": "sigmoid", "norm_topk_prob": True, "routed_scaling_factor": 2.5,
               "first_k_dense_replace": 1, "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": 128,
               "qk_nope_head_dim": 64, "qk_rope_head_dim": 64, "v_head_dim": 64, "hidden_act": "silu",
               "vocab_size": VOCAB, "max_position_embeddings": MAX_POSITIONS, "rope_theta": 50000.0,
               "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096,
                                "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
               "rms_norm_eps": 1e-5, "attention_bias": False, "tie_word_embeddings": False,
               "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16"}
KIMI_K2_CONFIG_PY = '''"""Kimi-K2: DeepSeek-V3's configuration under its own model type."""
from transformers import DeepseekV3Config


class KimiK2Config(DeepseekV3Config):
    model_type = "kimi_k2"
'''
VISION = {"model_type": "kimi_k25_vision", "patch_size": 14, "init_pos_emb_height": 8, "init_pos_emb_width": 8,
          "init_pos_emb_time": 4, "num_attention_heads": 2, "num_hidden_layers": 1, "hidden_size": 64,
          "intermediate_size": 128, "merge_kernel_size": [2, 2]}
DRAFTER = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "intermediate_size": 512,
           "num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 64,
           "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
           "norm_before_residual": False}


def text_config(kind: str) -> dict:
    """The text model's config of a target kind (the whole config but for ``kimi_k25``'s wrapper)."""
    _kind(kind)
    if kind == "llama":
        return copy.deepcopy(LLAMA)
    cfg = copy.deepcopy(DEEPSEEK_V3)
    if kind in ("kimi_k2", "kimi_k25"):
        cfg["model_type"] = "kimi_k2"
    return cfg


def config(kind: str) -> dict:
    """The target's config.json."""
    text = text_config(kind)
    if kind == "kimi_k2":
        text["auto_map"] = {"AutoConfig": "configuration_kimi_k2.KimiK2Config"}
    if kind != "kimi_k25":
        return text
    return {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
            "media_placeholder_token_id": SPECIALS.index("<|media_pad|>"), "pad_token_id": ROLES_ID["pad"],
            "ignore_index": -100, "torch_dtype": text["torch_dtype"], "text_config": text,
            "vision_config": copy.deepcopy(VISION)}


ROLES_ID = {k: SPECIALS.index(v) for k, v in ROLES.items()}


def _kind(kind: str):
    if kind not in KINDS:
        raise SpecdeployError([Finding("error", "tiny model", f"unknown kind {kind!r}",
                                       f"use one of {', '.join(KINDS)}")])


def _target_spec(kind: str) -> dict:
    text = text_config(kind)
    files = {"configuration_kimi_k2.py": KIMI_K2_CONFIG_PY} if kind == "kimi_k2" else {}
    return {"what": "target", "kind": kind, "family": "llama" if kind == "llama" else "mla",
            "seed": 1000 + KINDS.index(kind),
            "config": config(kind), "text": text, "dtype": text["torch_dtype"],
            "prefix": "language_model." if kind == "kimi_k25" else "",
            "generation": {"bos_token_id": ROLES_ID["bos"], "eos_token_id": [SPECIALS.index("<|im_end|>"),
                                                                             ROLES_ID["eos"]],
                           "do_sample": False},
            "files": files,
            "tokenizer": {"vocab_size": VOCAB, "special_tokens": list(SPECIALS), "roles": ROLES, "seed": 7,
                          "chat_template": CHAT_TEMPLATE, "model_max_length": text["max_position_embeddings"]}}


def _drafter_spec(kind: str, quality: str) -> dict:
    if quality not in QUALITIES:
        raise SpecdeployError([Finding("error", "tiny drafter", f"unknown quality {quality!r}",
                                       f"use one of {', '.join(QUALITIES)}")])
    text = text_config(kind)
    n = text["num_hidden_layers"]
    taps = [1, n // 2, n - 1]  # vLLM numbering (input of layer L); SGLang's is one less
    cfg = dict(copy.deepcopy(DRAFTER), hidden_size=text["hidden_size"], target_hidden_size=text["hidden_size"],
               vocab_size=text["vocab_size"], draft_vocab_size=text["vocab_size"] - len(SPECIALS) + len(DRAFT_SPECIALS),
               max_position_embeddings=text["max_position_embeddings"], torch_dtype=text["torch_dtype"],
               eagle_aux_hidden_state_layer_ids=taps,
               eagle_config={"eagle_aux_hidden_state_layer_ids": [t - 1 for t in taps], "use_aux_hidden_state": True})
    return {"what": "drafter", "quality": quality, "draft_specials": list(DRAFT_SPECIALS),
            "seed": 2000 + 10 * KINDS.index(kind) + QUALITIES.index(quality),
            "config": cfg, "dtype": text["torch_dtype"]}


def python(progress=None) -> Path:
    """The Python that writes the artifacts (the vLLM 0.32.0 real-engine venv's; built if missing)."""
    v = realengine.path(VENV_VERSION) if realengine.ready(VENV_VERSION) else realengine.venv(VENV_VERSION, progress)
    return v / "bin" / "python"


def _generate(spec: dict, tmp: Path, progress=None):
    py = python(progress)
    if progress:
        progress(f"writing {tmp.name}")
    p = subprocess.run([str(py), str(GENERATOR), str(tmp)], input=json.dumps(spec), capture_output=True, text=True,
                       env={**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"})
    if p.returncode != 0:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-15:])
        raise SpecdeployError([Finding("error", "tiny model", f"the generator failed (exit {p.returncode}):\n{tail}",
                                       f"run {py} {GENERATOR} by hand to see why")])


def _key(spec: dict, extra: str = "") -> str:
    return cache.inputs_key(json.dumps(spec, sort_keys=True), GENERATOR, _generate, realengine.key(VENV_VERSION),
                            extra)


def target_key(kind: str) -> str:
    return _key(_target_spec(kind))


def _world_readable(entry: Path) -> Path:
    """The generator's safetensors are written 0600; a model is read by an engine's service user (a sandbox host
    stages it with its modes), so every file is 0644."""
    for f in entry.iterdir():
        if f.is_file() and not f.is_symlink() and f.stat().st_mode & 0o044 != 0o044:
            f.chmod(0o644)
    return entry


def target(kind: str, progress=None) -> Path:
    """The tiny target model directory of ``kind`` (built on first use)."""
    spec = _target_spec(kind)
    k = _key(spec)
    final = CACHE / f"tinymodels-{kind}-{k[:16]}"
    out = cache.build_entry(final, k, lambda tmp: _generate(spec, tmp, progress), LOCK,
                            f"tiny model {kind} build", progress)
    _prune(f"tinymodels-{kind}-{'?' * 16}", out)
    return _world_readable(out)


def drafter(target_kind: str, quality: str = "good", progress=None) -> Path:
    """An EAGLE-3 drafter for the tiny ``target_kind`` target: ``good`` or ``random`` (built on first use)."""
    spec = _drafter_spec(target_kind, quality)
    tdir = target(target_kind, progress)
    spec = dict(spec, target=str(tdir))
    k = _key(spec, target_key(target_kind))
    name = f"{target_kind}-eagle3-{quality}"
    final = CACHE / f"tinymodels-{name}-{k[:16]}"
    out = cache.build_entry(final, k, lambda tmp: _generate(spec, tmp, progress), LOCK,
                            f"tiny drafter {name} build", progress)
    _prune(f"tinymodels-{name}-{'?' * 16}", out)
    return _world_readable(out)


def meta(path: Path) -> dict:
    """What the generator recorded: for a target ``successor`` (token -> the target's greedy next token),
    ``special_tokens`` (name -> id), ``tokenizer_size``; for a drafter ``quality``, ``target_kind``, ``draft_vocab``."""
    return json.loads((Path(path) / "specdeploy-tiny.json").read_text())


def _prune(pattern: str, keep: Path):
    with cache.locked(LOCK, "tiny model prune"):
        cache.prune(CACHE, pattern, keep=keep)


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(prog="python -m specdeploy.testing.tinymodels")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build (or reuse) tiny targets and drafters; prints their paths")
    b.add_argument("kind", nargs="+", choices=KINDS)
    b.add_argument("--drafter", action="append", choices=QUALITIES, default=[])
    a = ap.parse_args(argv)
    say = lambda m: print(f"[tinymodels] {m}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        for kind in a.kind:
            print(target(kind, say))
            for q in a.drafter:
                print(drafter(kind, q, say))
    except SpecdeployError as e:
        print(e, file=sys.stderr)  # one line per problem, with its fix
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
