"""The plan of a host: its units, env files, command line and image, rendered from its validated variables
(``host``), and the pieces it is made of: ``render/`` (units, env files, quoting, runtime, Prometheus), ``images``,
``patches/`` and ``outdir`` (a command's ``--out`` written beside and renamed in)."""
from specdeploy.plan.host import (HostPlan, engine_command, image_patch_label, plan, prometheus_targets,
                                  render_host, secret_files, write_out)

__all__ = ["HostPlan", "engine_command", "image_patch_label", "plan", "prometheus_targets", "render_host",
           "secret_files", "write_out"]
