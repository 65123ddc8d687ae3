"""``python -m quarl.cli``: the console script."""

from quarl.cli import main

main()
