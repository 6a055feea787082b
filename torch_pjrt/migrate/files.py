"""Finding the Python files under a path, and replacing a file atomically."""

from __future__ import annotations

import errno
import os
import stat
import tempfile

__all__ = ["MigrateError", "python_files", "read_source", "write_atomic"]

# folders never entered: hidden ones (.git, .venv, ...) and bytecode caches
_SKIP_DIRS = ("__pycache__",)


class MigrateError(Exception):
    """A file that cannot be read, analyzed or written; the message says why and what to do."""


def python_files(root: str) -> tuple[list[str], list[str]]:
    """The ``*.py`` files under ``root`` (or ``root`` itself, a file), and notes.

    Symbolic links to folders are followed once: a link back to a folder already seen
    (a loop) is skipped with a note. A file reached through two paths is listed once.
    """
    if not os.path.isdir(root):
        return [root], []
    files, notes, seen_dirs, seen_files = [], [], set(), set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen_dirs:
            notes.append(f"skipped {dirpath}: a symbolic link back to {real} (a loop)")
            dirnames[:] = []
            continue
        seen_dirs.add(real)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in _SKIP_DIRS)
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            real_file = os.path.realpath(path)
            if real_file in seen_files:
                notes.append(f"skipped {path}: the same file as one already listed")
                continue
            seen_files.add(real_file)
            files.append(path)
    return files, notes


def read_source(path: str) -> bytes:
    """The bytes of a Python source file; :class:`MigrateError` when it is not one."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise MigrateError(_os_reason(path, exc, "read")) from None
    if b"\0" in data:
        raise MigrateError(
            f"{path}: a binary file (it contains NUL bytes), not Python source; skipped. "
            "Remove it from the folder or rename it if it is not Python."
        )
    return data


def _os_reason(path: str, exc: OSError, doing: str) -> str:
    if exc.errno == errno.ELOOP:
        return f"{path}: a symbolic link loop; cannot {doing} it. Fix or remove the link."
    if exc.errno == errno.ENOENT and os.path.islink(path):
        return f"{path}: a symbolic link to a missing file; cannot {doing} it."
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"{path}: permission denied; cannot {doing} it."
    if exc.errno == errno.EISDIR:
        return f"{path}: a folder, expected a file."
    return f"{path}: cannot {doing} it: {exc.strerror or exc}"


def write_atomic(path: str, data: bytes) -> None:
    """Replace the file at ``path`` (through symbolic links) with ``data``, atomically.

    The new text goes to a temporary file in the same folder, which then replaces the
    old one (``os.replace``): a reader sees the old file or the new one, never a part.
    The file's permission bits are kept. A read-only file is not replaced.
    """
    target = os.path.realpath(path)
    try:
        st = os.stat(target)
    except OSError as exc:
        raise MigrateError(_os_reason(path, exc, "write")) from None
    if not (st.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)) or not os.access(
        target, os.W_OK
    ):
        raise MigrateError(
            f"{path}: read-only; not rewritten. Make it writable (chmod u+w) and run "
            "`torch-pjrt migrate --apply` again."
        )
    folder, name = os.path.split(target)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".migrate-tmp", dir=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, stat.S_IMODE(st.st_mode))
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        raise MigrateError(
            f"{path}: not rewritten, the file is unchanged: cannot write in {folder}: "
            f"{exc.strerror or exc}"
        ) from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
