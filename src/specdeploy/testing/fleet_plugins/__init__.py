"""Ansible plugins of the simulated fleet (docs/fleet.md), loaded only by the tests and bench/fleet_scale.py
through ANSIBLE_CONNECTION_PLUGINS; production's ansible.cfg never names this directory."""
