"""Ansible's door to specdeploy's callback that keeps the controller's heap out of its forked workers' garbage
collections (specdeploy.deploy.forking, docs/fleet.md). Ansible loads it from beside the playbooks; nothing is
decided here."""
from specdeploy.deploy.forking import CallbackModule  # noqa: F401 (what Ansible loads)
