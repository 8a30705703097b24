"""Checks before and after an engine starts: preflight, the model's config and safetensors headers, readiness."""
