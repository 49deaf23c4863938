"""``python -m jobfence.cli``."""

from . import main

main()
