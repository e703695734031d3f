"""``python -m flows.cli``: the ``tsi`` command line."""

from flows.cli import main

main()
