"""Ansible's door into specdeploy's core: every filter the playbooks and roles call lives in the tested, layered
package ``specdeploy.deploy`` (src/specdeploy/deploy/), so a deploy renders exactly what ``specdeploy plan`` shows
and checks exactly what ``specdeploy preflight`` checks. Nothing is decided here."""
from specdeploy.deploy.filters import FilterModule  # noqa: F401 (what Ansible loads)
