"""The ``specdeploy`` command line, one module per command group:

- ``core``: plan, engine argv/image/standin, schema, wheelhouse (the controller's rendering commands);
- ``host``: simulate, ready, exporter (the commands units and roles run on a host);
- ``ops``: preflight, triage, breakeven, gate;  ``frontdoor``: deploy, rollback, verify, status, report;
- ``nccl``, ``drafter``, ``patch``, ``sandbox``: their sub-commands.

``groups`` lists them by audience in ``specdeploy --help`` (operate; check and diagnose; ``specdeploy host ...`` and
``specdeploy dev ...``, whose old top-level names stay as hidden aliases).

The options every command shares and the one error path are in ``options``. Loading the CLI imports typer and
these modules only; each command imports what it needs when it runs."""
from __future__ import annotations

import sys

from specdeploy.values.errors import SpecdeployError
from specdeploy.cli.app import app
from specdeploy.cli.options import print_findings

# Each module adds its commands to ``app`` when imported; this order is the order of ``specdeploy --help``.
from specdeploy.cli import frontdoor, core, ops, host, drafter, probe, nccl, patch, sandbox  # noqa: E402, F401, I001

app.add_typer(core.engine_app, name="engine")
app.add_typer(core.schema_app, name="schema")
app.add_typer(nccl.nccl_app, name="nccl")
app.add_typer(drafter.drafter_app, name="drafter")
app.add_typer(patch.patch_app, name="patch")
app.add_typer(sandbox.sandbox_app, name="sandbox")

from specdeploy.cli.groups import group, version_callback  # noqa: E402
import typer  # noqa: E402


@app.callback()
def _root(version: bool = typer.Option(False, "--version", is_eager=True, callback=version_callback,
                                       help="Print specdeploy's version and the engine releases it knows, and exit.")):
    """Deploy an MoE model with an EAGLE-3 drafter on vLLM or SGLang, and prove it pays."""


group(app)


def main():
    try:
        app()
    except SpecdeployError as exc:  # any command that did not catch its own
        print_findings(exc)
        sys.exit(2)


__all__ = ["app", "main"]
