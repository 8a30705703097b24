"""``python -m specdeploy.cli``."""
from specdeploy.cli import main

main()
