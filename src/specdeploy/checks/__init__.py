"""Checks before and after an engine starts: preflight, readiness, and the engine probe (the pinned engine's own
code judging the target and the drafter, as opposed to specdeploy's reading of it)."""
