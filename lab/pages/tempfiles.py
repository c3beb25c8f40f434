"""Files the page hands out or takes in live only as long as they are needed: an upload is deleted once it is
read, an export or a replay once the page's download has its copy; whatever is left behind goes after
`FILES_AGE_S`."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

FILES_AGE_S = int(os.environ.get("ENVLAB_FILES_AGE_S") or 3600)  # how long an upload or a download is kept
SWEEP_S = 300  # how often the page's own file cache is swept (Gradio's `delete_cache`)
EXPORTS = "envlab-export-"  # the prefix of the page's export folders in the temp folder
REPLAYS = "envlab-replay-"  # the prefix of the page's replay folders (an episode's HTML and GIF) in the temp folder


def sweep(prefix: str, age_s: float, folder: str | Path | None = None) -> list[Path]:
    """Remove the folders `prefix*` in `folder` (the temp folder) last changed more than `age_s` seconds ago;
    returns those removed."""
    root = Path(folder or tempfile.gettempdir())
    gone = []
    now = time.time()
    for path in root.glob(f"{prefix}*"):
        try:
            old = now - path.lstat().st_mtime > age_s
        except FileNotFoundError:  # removed meanwhile by another sweep
            continue
        if old and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
            gone.append(path)
    return gone
