"""A machine's stable identity: a random id kept in the pack's cache folder.

A worker sends it in its hello, and the main keys what it measured of that machine (the
network link, `calibrate --workers`) by it rather than by the alias a workflow gives the
worker: the same machine under another alias keeps its figures, and another machine
under an old alias never borrows them. Random, not derived from the hostname or a
hardware serial: it says nothing about the machine but that it is the same one."""
import os
import secrets
import tempfile
from pathlib import Path
from typing import Optional

from .machine_figures import cache_dir
from .remote_devices import valid_id

FILE_NAME = "machine_id"


def machine_id(folder: Optional[Path] = None) -> Optional[str]:
    """This machine's id, made on first use; None when the cache folder cannot hold it
    (a read-only home): then nothing is keyed by it and the main falls back to aliases."""
    path = Path(folder or cache_dir()) / FILE_NAME
    try:
        return _read(path) or _create(path)
    except OSError:
        return None


def _read(path: Path) -> Optional[str]:
    try:
        text = path.read_text(encoding="ascii").strip()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    return valid_id(text)


def _create(path: Path) -> Optional[str]:
    """Written whole under a temporary name, then linked into place: two workers starting
    at once both read the one id that won, never a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".machine-id-", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(secrets.token_hex(16) + "\n")
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)
    return _read(path)
