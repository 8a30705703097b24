"""Whether speculation pays: the price of verification, the gate, the exporter, the monitoring rules and dashboard, the
report."""
