"""Files the page hands out or takes in live only as long as they are needed: an upload is deleted once it is
read, an export or a replay once the page's download has its copy; whatever is left behind goes after
`FILES_AGE_S`.

Uploads are held to a quota (`UploadQuota`) before Gradio writes a byte: each file, how many are kept at once and
their bytes together, so a client that uploads without importing cannot fill the disk. Gradio keeps uploads and
the page's downloads in a folder of the lab's own, `<runs root>/.gradio`, its user's alone (`private_temp`),
rather than the `/tmp/gradio` every user of the machine shares.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.archive import Limits
from lab.archive.reading import GIB, parse_size

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


GRADIO_FOLDER = ".gradio"  # under the runs root: Gradio's uploads and the copies of the page's downloads
TEMP_SETTING = "GRADIO_TEMP_DIR"  # where Gradio keeps them (read as each component and the app are made)


def private_temp(root: Path) -> Path:
    """`<root>/.gradio`, made (or set) mode 0700, and named in `$GRADIO_TEMP_DIR` for the Gradio of this process:
    uploads and downloads hold runs, notes and checkpoints, so they stay in a folder of the lab's user alone, on the
    runs root's disk. Call it before the page is built. Raises OSError when the name is taken by anything but a
    folder of this user's (a link, a file)."""
    folder = root / GRADIO_FOLDER
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise OSError(f"{folder} is not a folder of this user's: the page keeps its uploads nowhere else")
    folder.chmod(0o700)
    os.environ[TEMP_SETTING] = str(folder)
    return folder


@dataclass(frozen=True)
class UploadQuota:
    """What the page takes in uploads: `file` bytes per upload (`ENVLAB_ARCHIVE_UPLOAD`, `Limits.upload`), at most
    `count` uploads kept at once (`ENVLAB_UPLOADS_KEPT`) and `total` bytes of them together
    (`ENVLAB_UPLOADS_TOTAL`, 64k/16m/2g), and never more than the disk has free. An upload is kept until it is
    imported (then deleted) or `FILES_AGE_S` has passed."""

    file: int = GIB
    count: int = 8
    total: int = 2 * GIB

    @classmethod
    def from_env(cls) -> UploadQuota:
        count = os.environ.get("ENVLAB_UPLOADS_KEPT")
        total = os.environ.get("ENVLAB_UPLOADS_TOTAL")
        return cls(file=Limits.from_env().upload, count=int(count) if count else cls.count,
                   total=parse_size(total, "ENVLAB_UPLOADS_TOTAL") if total else cls.total)

    def refusal(self, kept: list[int], size: int | None, coming: int, free: int) -> str | None:
        """Why an upload of `size` bytes (None: not declared) is refused while uploads of `kept` bytes are kept,
        `coming` bytes are on their way and the disk has `free` bytes; None: it is taken."""
        size_or_most = self.file if size is None else min(size, self.file)
        if size is not None and size > self.file + MULTIPART_SLACK:
            return f"an upload is at most {_size(self.file)} (ENVLAB_ARCHIVE_UPLOAD); this one is {_size(size)}"
        if len(kept) >= self.count:
            return (f"the lab keeps at most {self.count} uploads at once (ENVLAB_UPLOADS_KEPT) and holds "
                    f"{len(kept)}: import them, or wait until they are deleted ({FILES_AGE_S // 60} min after upload)")
        if sum(kept) + coming + size_or_most > self.total:
            return (f"the lab keeps at most {_size(self.total)} of uploads at once (ENVLAB_UPLOADS_TOTAL) and holds "
                    f"{_size(sum(kept) + coming)}: this upload of {_size(size_or_most)} would pass it")
        if size_or_most > free:
            return (f"the disk that keeps uploads has {_size(free)} free: this upload of {_size(size_or_most)} "
                    "would fill it")
        return None


MULTIPART_SLACK = 64 * 1024  # a request's bytes beyond its file's: the form's headers and boundaries
UPLOAD_PATH = "/gradio_api/upload"

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def _size(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n} bytes"


class QuotaGate:
    """ASGI middleware in front of Gradio's upload route: an upload past `UploadQuota` is refused with HTTP 413 and
    one line naming the bound, before Gradio writes a byte. Uploads kept are the files Gradio recorded as uploaded
    (`Blocks.upload_file_set`) that are still there; an upload under way counts with its declared length (or the
    per-file bound, where it declares none) until it ends."""

    def __init__(self, app: Callable[..., Awaitable[None]], quota: UploadQuota | None = None):
        self.app = app
        self.quota = quota or UploadQuota.from_env()
        self.coming = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"].rstrip("/") != UPLOAD_PATH:
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        declared = headers.get("content-length", "")
        size = int(declared) if declared.isdigit() else None
        blocks = scope["app"].get_blocks() if hasattr(scope.get("app"), "get_blocks") else None
        kept = kept_uploads(blocks.upload_file_set if blocks is not None else ())
        folder = Path(os.environ.get(TEMP_SETTING) or tempfile.gettempdir())
        free = shutil.disk_usage(_existing(folder)).free
        if (refused := self.quota.refusal(kept, size, self.coming, free)) is not None:
            return await _refuse(send, refused)
        held = self.quota.file if size is None else min(size, self.quota.file)
        self.coming += held
        try:
            await self.app(scope, receive, send)
        finally:
            self.coming -= held


def kept_uploads(paths: Any) -> list[int]:
    """The sizes of the uploads among `paths` that are still on disk."""
    sizes = []
    for path in list(paths):
        try:
            sizes.append(os.stat(path).st_size)
        except OSError:  # imported (deleted) or swept
            continue
    return sizes


def _existing(path: Path) -> Path:
    return next((p for p in (path, *path.parents) if p.exists()), Path("/"))


async def _refuse(send: Send, why: str) -> None:
    """HTTP 413 with `why` as plain text, as Gradio's own refusal of a large file: the page shows "HTTP 413: <why>"."""
    data = why.encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(data)).encode()), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": data})
