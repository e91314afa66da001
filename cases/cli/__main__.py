"""``python -m cases.cli``: the ``pfa-verify`` command."""
import sys

from pfa_verify.cases.cli import main

sys.exit(main())
