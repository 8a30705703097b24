"""Run by a real vLLM venv's Python (the installed package, or a patched copy first on PYTHONPATH): what that vLLM's
own code does with a Kimi-K2.5 / DeepSeek target's EAGLE-3 support, without starting an engine. Prints JSON.

    python real_vllm_probe.py KIMI_K25_TARGET_DIR

- ``supports_eagle3``: the engine's ``supports_eagle3`` on DeepseekV2/V3ForCausalLM and KimiK25ForConditionalGeneration;
- ``aux_layers``: what the classes' ``get_eagle3_aux_hidden_state_layers`` return for a 61-layer model, and what
  ``set_aux_hidden_state_layers`` stores (absent when the classes have no such methods);
- ``image_token``: the EAGLE proposer's ``load_model`` run on a KimiK25 target object that carries the engine's own
  ``KimiK25Config`` read from the target directory, up to the point where it asks the target for its language model:
  the image token index it gave the drafter, or the exception it raised first.
"""
from __future__ import annotations

import json
import sys
from types import SimpleNamespace


class _Stop(Exception):
    """The proposer got past the image-token branch."""


def main():
    target_dir = sys.argv[1]
    import vllm
    from vllm.model_executor.models.deepseek_v2 import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM
    from vllm.model_executor.models.interfaces import supports_eagle3
    from vllm.model_executor.models.kimi_k25 import KimiK25ForConditionalGeneration
    from vllm.transformers_utils.configs.kimi_k25 import KimiK25Config
    from vllm.v1.spec_decode import eagle

    out = {"vllm": vllm.__version__, "vllm_file": vllm.__file__}
    classes = (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, KimiK25ForConditionalGeneration)
    out["supports_eagle3"] = {c.__name__: bool(supports_eagle3(c)) for c in classes}

    if hasattr(DeepseekV2ForCausalLM, "get_eagle3_aux_hidden_state_layers"):
        ds = SimpleNamespace(model=SimpleNamespace(layers=[None] * 61))
        kimi = SimpleNamespace(language_model=SimpleNamespace(
            get_eagle3_aux_hidden_state_layers=lambda: DeepseekV2ForCausalLM.get_eagle3_aux_hidden_state_layers(ds),
            set_aux_hidden_state_layers=lambda layers: DeepseekV2ForCausalLM.set_aux_hidden_state_layers(ds, layers)))
        KimiK25ForConditionalGeneration.set_aux_hidden_state_layers(kimi, (2, 30, 58))
        out["aux_layers"] = {
            "DeepseekV2ForCausalLM": list(DeepseekV2ForCausalLM.get_eagle3_aux_hidden_state_layers(ds)),
            "KimiK25ForConditionalGeneration": list(KimiK25ForConditionalGeneration.get_eagle3_aux_hidden_state_layers(
                kimi)),
            "set_through_the_wrapper": list(ds.model.aux_hidden_state_layers)}

    cfg = KimiK25Config.from_pretrained(target_dir)
    out["media_placeholder_token_id"] = cfg.media_placeholder_token_id

    class Target:
        supports_multimodal = True
        config = cfg

        def get_language_model(self):
            raise _Stop

    Target.__name__ = "KimiK25ForConditionalGeneration"

    class Proposer:
        supports_mm_inputs = False
        vllm_config = None
        get_model_name = eagle.EagleProposer.get_model_name

        def _get_model(self):
            return SimpleNamespace(config=SimpleNamespace())

    eagle.get_layers_from_vllm_config = lambda *a, **k: {}  # no engine: no attention layers registered
    p = Proposer()
    try:
        eagle.EagleProposer.load_model(p, Target())
        out["image_token"] = {"error": "load_model returned without asking for the language model"}
    except _Stop:
        out["image_token"] = {"image_token_index": p.model.config.image_token_index}
    except Exception as exc:  # noqa: BLE001 - the engine's own failure is the answer
        out["image_token"] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
