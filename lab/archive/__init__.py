"""Runs travel: one file holds a run's rows, and optionally its stages' checkpoints, to load into another lab.

The file is a zip (docs/archive.md): `manifest.json` (format name, version, what the file holds),
`tables/<table>.jsonl` (one JSON object per row, every column by name, the ids of the database it came from)
and `checkpoints/<stored path>/...` (a stage's checkpoint folder, at the path its stage row stores).

The room's modules, in the order a run travels: `tables` (the format: which tables travel and how their ids
link), `export` (writing a file), `reading` (the untrusted reading: the file's layout, its manifest, what a row
may hold) and `importing` (vouching for every row, then one transaction). What the rest of the lab uses is here.
"""

from lab.archive.export import export_run
from lab.archive.importing import Imported, import_archive, import_run
from lab.archive.reading import Limits, parse_size, read_manifest
from lab.archive.tables import ArchiveError, run_tables

__all__ = ["ArchiveError", "Imported", "Limits", "export_run", "import_archive", "import_run", "parse_size",
           "read_manifest", "run_tables"]
