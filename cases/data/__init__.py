"""Case data: the catalog, generated selections, captured regressions and their files, schemas, versions.

The data files themselves sit in :data:`FOLDER` (``cases/``: ``catalog.json``, ``regressions/``, the
``*.schema.json`` files, ``tightness.json``, the report templates), where users and the docs find them;
the code that reads and writes them lives here."""
from pathlib import Path

#: cases/, the folder that holds the suite's data files.
FOLDER = Path(__file__).resolve().parent.parent
