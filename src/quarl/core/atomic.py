"""Writing files so that a full disk (or a kill) never leaves half of one: every file quarl
writes goes to a temporary file in the same folder, is flushed to the disk (``fsync``) and
renamed over its name, and the temporary is removed when anything fails. A reader sees the
old file or the new one, never a truncated ``original.zip`` or a stray ``.tmp``; ENOSPC
(and the other errors a disk gives) ends in one line naming the file, and what was finished
before it stays as it was.

:func:`write_atomic` takes the content (text or bytes) or a function that writes a path
(``torch.save``, SB3's ``model.save``, ``np.savez``, matplotlib's ``savefig``): the
temporary keeps the file's suffix, since those pick a format or add an extension from it.
:func:`append_line` appends to a log (``results.jsonl``) and cuts it back to where it was
when the line cannot be written whole.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

from quarl.core.errors import QuarlError

TEMPORARY_MARK = ".tmp"
"""Part of every temporary's name (``.NAME.PID.THREAD.tmp.SUFFIX``)."""


def temporary_for(path: Path) -> Path:
    """The temporary :func:`write_atomic` writes ``path`` through: in the same folder (a
    rename within one file system is atomic), hidden, unique to this process and thread,
    with ``path``'s suffix."""
    return path.with_name(f".{path.stem}.{os.getpid()}.{threading.get_ident() % 10**6}{TEMPORARY_MARK}{path.suffix}")


def write_error(path: Path, exc: BaseException) -> QuarlError:
    """The one line for a file that could not be written (the disk's reason, and that what
    was finished before is kept)."""
    if isinstance(exc, OSError):
        reason = exc.strerror or (os.strerror(exc.errno) if exc.errno else str(exc) or type(exc).__name__)
    else:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:200]
    return QuarlError(f"{path} could not be written ({reason}): nothing was written to it; what finished before "
                      "is kept")


def _write_failure(exc: BaseException) -> bool:
    """An error that says the file could not be written: an OSError, or torch's
    RuntimeError around one (``PytorchStreamWriter failed writing file``)."""
    if isinstance(exc, OSError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("failed writing file" in text or "file write failed" in text
                                              or "No space left" in text)


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError:  # the folder went read-only: nothing more to do
        pass


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (best effort: some file systems refuse a folder fsync)."""
    try:
        _fsync_path(folder)
    except OSError:
        pass


def _write_bytes(fd: int, data: bytes, path: Path) -> None:
    """All of ``data`` to descriptor ``fd``, open on ``path`` (a short write goes on where
    it stopped)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _call_writer(write: Callable[[Path], Any], tmp: Path) -> None:
    write(tmp)


def _write_temporary(tmp: Path, content: str | bytes | Callable[[Path], Any], encoding: str) -> None:
    if callable(content):
        _call_writer(content, tmp)
        _fsync_path(tmp)
        return
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        _write_bytes(fd, content.encode(encoding) if isinstance(content, str) else content, tmp)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path | str, content: str | bytes | Callable[[Path], Any], encoding: str = "utf-8") -> Path:
    """Write ``content`` (text, bytes, or a function writing the path it is given) to
    ``path`` atomically: a temporary in the same folder, fsync, rename. On any failure the
    temporary is removed and ``path`` is as it was; a failed write (ENOSPC, a read-only
    folder, torch's writer failing) is :class:`QuarlError` naming ``path``."""
    return write_all_atomic([(Path(path), content)], encoding)[0]


def write_all_atomic(files: Sequence[tuple[Path, str | bytes | Callable[[Path], Any]]],
                     encoding: str = "utf-8") -> list[Path]:
    """Write files that belong together (an export's model and its sidecar, a table's CSV /
    Markdown / JSON): every temporary is written and flushed before the first is renamed, so
    a full disk leaves all of them as they were, never a new model beside an old sidecar."""
    done: list[Path] = []
    pending = [(Path(path), temporary_for(Path(path)), content) for path, content in files]
    current = None
    try:
        for path, tmp, content in pending:
            current = path
            _write_temporary(tmp, content, encoding)
        for path, tmp, _ in pending:
            current = path
            os.replace(tmp, path)
            done.append(path)
    except BaseException as exc:
        for _, tmp, _ in pending:
            _remove(tmp)
        if _write_failure(exc) and current is not None:
            raise write_error(current, exc) from None
        raise
    for folder in dict.fromkeys(path.parent for path in done):
        _fsync_folder(folder)
    return done


def append_line(path: Path | str, line: str) -> None:
    """Append ``line`` (a newline added) to ``path`` and fsync it; when it cannot be written
    whole (ENOSPC), the file is cut back to its length before, so it never ends in half a
    line, and the error is one line naming the file."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError as exc:
        raise write_error(path, exc) from None
    try:
        start = os.fstat(fd).st_size
        try:
            _write_bytes(fd, (line + "\n").encode("utf-8"), path)
            os.fsync(fd)
        except OSError as exc:
            try:
                os.ftruncate(fd, start)
            except OSError:
                pass
            raise write_error(path, exc) from None
    finally:
        os.close(fd)


DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO})
"""What a disk answers when it cannot take a write: the CLI turns a stray one (a writer not
yet through :func:`write_atomic`) into one line too."""
