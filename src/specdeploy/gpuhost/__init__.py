"""The facts of a GPU host: versions, nvidia-smi, PCIe topology and ACS, the fabric manager, what a bare host needs, and
the report."""
