"""Rendering what a deployment installs on a host, one place each:

- ``paths``: where things live on a host (directories, service user, unit names, the converted drafter);
- ``systemd``: the templates and systemd's (and docker's env-file) syntax: units, env files, the router unit;
- ``runtime``: wrapping the engine command for the runtime (``docker run`` or the host venv);
- ``prometheus``: the scrape config.

The host plan that puts them together (:func:`specdeploy.plan.render_host`) is called by the CLI
(``specdeploy plan``) and by Ansible (filter ``specdeploy_render``) alike, so a plan and a deploy cannot disagree.
"""
