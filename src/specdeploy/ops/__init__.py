"""Operating deployments: the runner around ansible-playbook and its progress, status, and the wheelhouse."""
