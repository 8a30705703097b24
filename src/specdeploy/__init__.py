"""specdeploy: deploy a Kimi-K2.5-class MoE model with an EAGLE-3 drafter on vLLM or SGLang."""

__version__ = "0.1.0"
