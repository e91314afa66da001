"""Cases: the ``pfa-verify`` command and the suite's case data, in four rooms by concern.

- ``cases.data``: the catalog, generated selections, captured regressions, schemas, versions, provenance
  (the data files themselves sit in this folder: ``catalog.json``, ``regressions/``, ``*.schema.json``);
- ``cases.running``: ``pfa-verify run``, the worker pool (local or Ray), shrinking, the search;
- ``cases.reporting``: terminal, JSON and HTML reports, and the comparison of two reports;
- ``cases.measuring``: the suite measuring itself (bench, tightness, the kill matrices).

Each room imports only the rooms listed before it; ``cases.cli`` (a package: every option of every subcommand) is the command line
over all four, and nothing imports it (the ``cases-rooms`` contract in pyproject.toml).
"""
