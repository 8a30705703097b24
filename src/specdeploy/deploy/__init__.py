"""The Ansible side of the core: the filters the playbooks and roles call (``deploy/filters.py`` collects them;
``ansible/filter_plugins/specdeploy.py`` is only a shim that hands them to Ansible), the decisions a deploy makes
per serving group (``deploy/decisions.py``), what a role needs to know about its host (``deploy/hostfacts.py``)
and the phase each task declares for the live view (``deploy/phases.py``). Roles install and configure; what they
decide is decided here, under the same tests and layers as the CLI."""
