"""The root ``specdeploy`` command; the command modules add their commands to it."""
from __future__ import annotations

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Deploy an MoE model with an EAGLE-3 drafter on vLLM or SGLang, and prove it pays.")
