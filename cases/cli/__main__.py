"""``python -m cases.cli``: the ``pfa-verify`` command."""
import sys

from cases.cli import main

sys.exit(main())
