"""pfa-verify: reference-first numerical verification of PyPTO's attention kernels.

The one import name the wheel installs. Its subpackages are the repository's top folders, linked in
here (pfa_verify/golden -> ../golden, ...), in the one direction golden <- kernels <- properties <- cases:

- ``pfa_verify.golden``: the pure-torch golden that is the contract (docs/spec.md), and its envelope.
- ``pfa_verify.kernels``: our PyPTO kernels and the backends that run a kernel under test.
- ``pfa_verify.properties``: strategies, laws, the acceptance rule, the diagnosis.
- ``pfa_verify.cases``: the catalog, captured cases, the ``pfa-verify`` command, reports.
"""
from pathlib import Path

#: The folder ``import pfa_verify`` is found in (site-packages, or the checkout of an editable install):
#: what a worker process puts first on its path, and where relative backend files are also looked for.
IMPORT_ROOT = Path(__file__).resolve().parent.parent
