"""Checks that run the pinned engine's own code (the engine probe), as opposed to specdeploy's reading of it."""
