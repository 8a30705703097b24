"""The validated variables of one host: the schema and its docs, the inventory readers (native YAML, Ansible's API and
vault, the checks every inventory file passes first) and argument checks."""
