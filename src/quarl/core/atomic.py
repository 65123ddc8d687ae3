"""Writing files so that a full disk (or a kill) never leaves half of one: every file quarl
writes goes to a temporary file in the same folder, is flushed to the disk (``fsync``) and
renamed over its name, and the temporary is removed when anything fails. A reader sees the
old file or the new one, never a truncated ``original.zip`` or a stray ``.tmp``; ENOSPC
(and the other errors a disk gives, a file-size limit's EFBIG among them) ends in one line
naming the file, and what was finished before it stays as it was.

:func:`write_atomic` takes the content (text or bytes) or a function that writes a path
(``torch.save``, SB3's ``model.save``, ``np.savez``, matplotlib's ``savefig``): the
temporary keeps the file's suffix, since those pick a format or add an extension from it.
:func:`write_all_atomic` publishes files that belong together (an export's model and its
sidecar) whole: both or neither, whatever kills the writer, whoever writes beside it
(:func:`finish_publishing`). :func:`append_line` appends to a log (``results.jsonl``) and
cuts it back to where it was when the line cannot be written whole.

Nothing outside what quarl created is deleted, truncated or appended to: a file is replaced
by a rename (a symbolic link in its place is replaced itself, never its target); a log or a
lock is opened without following a link and checked to be a regular file
(:func:`open_owned`: a named pipe would block); a folder quarl makes inside an output
folder is a real folder, never a link to another one (:func:`owned_folder`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

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


def _disk_refusal(tmp: Path) -> OSError | None:
    """The disk's refusal behind a writer's own error (a library that saw a short write and
    says something else): the temporary reached the process's file-size limit (EFBIG), or
    its file system has no space left (ENOSPC); None where neither holds."""
    import resource

    try:
        size = os.lstat(tmp).st_size
    except OSError:
        size = 0
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY and size >= limit:
        return OSError(errno.EFBIG, os.strerror(errno.EFBIG))
    try:
        space = os.statvfs(tmp.parent)
    except OSError:
        return None
    if space.f_bavail == 0 or (space.f_files and space.f_favail == 0):  # no block, or no inode, left
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return None


def _write_bytes(fd: int, data: bytes, path: Path) -> None:
    """All of ``data`` to descriptor ``fd``, open on ``path`` (a short write goes on where
    it stopped)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _call_writer(write: Callable[[Path], Any], tmp: Path) -> None:
    write(tmp)


def _write_temporary(tmp: Path, content: str | bytes | Callable[[Path], Any], encoding: str) -> None:
    _remove(tmp)  # a killed writer's (pids come back), or a link planted there: never written through
    if callable(content):
        try:
            _call_writer(content, tmp)
        except Exception as exc:
            refusal = None if isinstance(exc, OSError) else _disk_refusal(tmp)
            if refusal is not None:  # torch's writer says "unexpected pos 704 vs 598" where the disk said EFBIG
                raise refusal from exc
            raise
        _fsync_path(tmp)
        return
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
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
    Markdown / JSON) so that they are published both or neither: every temporary is written
    and flushed first (a full disk leaves all of them as they were, never a new model beside
    an old sidecar); then, holding the folder's lock (another writer's publication waits),
    a record naming the temporaries (:data:`PUBLISHING`) is written and the temporaries
    renamed. That record is the commit: a writer killed between two renames leaves it, and
    the next reader or writer of the folder finishes the renames (:func:`finish_publishing`)
    before it reads or writes anything there."""
    pending = [(Path(path), temporary_for(Path(path)), content) for path, content in files]
    for path, _, _ in pending:  # a rename over a folder fails: said before anything is written, never mid-publication
        if path.is_dir() and not path.is_symlink():
            raise QuarlError(f"{path} is a folder, not a file: quarl writes a file there; {OUT_HINT}")
    folders = list(dict.fromkeys(path.parent for path, _, _ in pending))
    together = len(pending) > 1 and len(folders) == 1
    current = None
    committed = False
    try:
        for path, tmp, content in pending:
            current = path
            _write_temporary(tmp, content, encoding)
        with _folder_lock(folders[0]) if together else contextlib.nullcontext():
            if together:
                _finish(folders[0])  # a killed writer's publication, finished before this one replaces it
                current = folders[0] / PUBLISHING
                _write_journal(folders[0], [(path.name, tmp.name) for path, tmp, _ in pending], encoding)
                committed = True
            for path, tmp, _ in pending:
                current = path
                os.replace(tmp, path)
            if together:
                _fsync_folder(folders[0])
                _remove(folders[0] / PUBLISHING)
    except BaseException as exc:
        if committed:  # the record names whole temporaries: finish what it began (or leave it to the next one)
            with contextlib.suppress(BaseException):
                with _folder_lock(folders[0]):
                    _finish(folders[0])
        else:
            for _, tmp, _ in pending:
                _remove(tmp)
        if _write_failure(exc) and current is not None:
            raise write_error(current, exc) from None
        raise
    for folder in folders:
        _fsync_folder(folder)
    return [path for path, _, _ in pending]


PUBLISHING = ".quarl-publishing.json"
"""In a folder where :func:`write_all_atomic` is replacing files together: which temporary
becomes which file (``{"files": [[NAME, TEMPORARY], ...]}``). Present only while the renames
run, or after the writer was killed among them."""
PUBLISHING_CAP = 1 << 16
"""Bytes a :data:`PUBLISHING` record may have (quarl's names a few files)."""


@contextlib.contextmanager
def _folder_lock(folder: Path, exclusive: bool = True) -> Iterator[None]:
    """``flock`` on the folder itself (no file of its own): publications in it one at a
    time, and readers (``exclusive=False``) never between two of their renames."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:  # a folder this process may not open: nothing to hold still
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        except OSError:  # a file system without flock (ENOLCK): the record alone still finishes a killed writer's
            pass
        yield
    finally:
        os.close(fd)


def _write_journal(folder: Path, names: list[tuple[str, str]], encoding: str) -> None:
    journal = folder / PUBLISHING
    tmp = temporary_for(journal)
    try:
        _write_temporary(tmp, json.dumps({"files": names}), encoding)
        os.replace(tmp, journal)
    except BaseException:
        _remove(tmp)
        raise
    _fsync_folder(folder)  # the record is on the disk before any file it names is replaced


def _plain_name(name: Any) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def _read_journal(journal: Path) -> list[tuple[str, str]]:
    """The (name, temporary) pairs of a :data:`PUBLISHING` record; one line where it is
    not one of quarl's (a link, a pipe, too large, names outside its folder)."""
    bad = QuarlError(f"{journal} is not a record quarl wrote (it names which temporary becomes which file while "
                     "files are replaced together): remove it and run the command that wrote that folder again")
    fd = open_owned(journal, os.O_RDONLY, "a publication record", hint="remove it")
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(PUBLISHING_CAP + 1)
    try:
        record = json.loads(data) if len(data) <= PUBLISHING_CAP else None
    except (ValueError, RecursionError):
        raise bad from None
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, list) or not all(
            isinstance(pair, list) and len(pair) == 2 and _plain_name(pair[0]) and _plain_name(pair[1])
            and pair[1].startswith(".") and TEMPORARY_MARK in pair[1] for pair in files):
        raise bad
    return [(name, tmp) for name, tmp in files]


def _finish(folder: Path) -> None:
    """Finish the publication a killed writer left in ``folder`` (its :data:`PUBLISHING`
    record): each temporary it names that is still there is renamed to its file (those
    already renamed are gone). Call holding the folder's lock."""
    journal = folder / PUBLISHING
    if not os.path.lexists(journal):
        return
    pairs = _read_journal(journal)
    try:
        for name, tmp_name in pairs:
            tmp = folder / tmp_name
            try:
                info = os.lstat(tmp)
            except FileNotFoundError:  # renamed before the writer stopped
                continue
            if not stat.S_ISREG(info.st_mode):
                raise QuarlError(f"{tmp} is {_kind(info.st_mode)}, not the file quarl wrote there: remove it and "
                                 f"{journal.name}, and run the command that wrote {folder} again")
            os.replace(tmp, folder / name)
        _fsync_folder(folder)
        journal.unlink()
    except OSError as exc:
        names = ", ".join(name for name, _ in pairs)
        raise QuarlError(f"{folder} holds files quarl began to replace together ({names}) and was stopped: they "
                         f"cannot be finished here ({exc.strerror or exc}); run the command that wrote them again") \
            from None


@contextlib.contextmanager
def reading_published(folder: Path) -> Iterator[None]:
    """Read files :func:`write_all_atomic` publishes together (an export's model and its
    sidecar) inside this: a publication in progress is waited for, and one a killed writer
    left half done is finished first, so the files read are one publication's."""
    folder = Path(folder)
    while True:
        with _folder_lock(folder, exclusive=False):
            # held shared, no writer is among its renames: a record there is a killed writer's
            if not os.path.lexists(folder / PUBLISHING):
                yield
                return
        finish_publishing(folder)  # exclusive (a second lock of this process's would wait on the shared one)


def finish_publishing(folder: Path) -> None:
    """Finish, holding the folder's lock, what a writer killed among its renames left in
    ``folder`` (nothing where no :data:`PUBLISHING` record is there)."""
    if os.path.lexists(Path(folder) / PUBLISHING):
        with _folder_lock(Path(folder)):
            _finish(Path(folder))


# ------------------------------------------------------------------ never through a link


def _kind(mode: int) -> str:
    return ("a symbolic link" if stat.S_ISLNK(mode) else "a named pipe" if stat.S_ISFIFO(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a folder" if stat.S_ISDIR(mode) else "a regular file" if stat.S_ISREG(mode) else "not a file")


OUT_HINT = "remove it or pass another --out"


def _link_error(path: Path, hint: str) -> QuarlError:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return QuarlError(f"{path} is a symbolic link (to {target}): quarl never writes, truncates or deletes through a "
                      f"link in a folder it writes; {hint}")


def check_owned(path: Path | str, hint: str = OUT_HINT) -> None:
    """One line where ``path`` is there but is a symbolic link or not a regular file (a
    named pipe, a folder): what quarl would append to or lock must be its own file."""
    path = Path(path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise _link_error(path, hint)
    if not stat.S_ISREG(info.st_mode):
        raise QuarlError(f"{path} is {_kind(info.st_mode)}, not a regular file: quarl writes only regular files there; "
                         f"{hint}")


def open_owned(path: Path | str, flags: int, what: str = "a file quarl writes", hint: str = OUT_HINT) -> int:
    """A descriptor of ``path`` opened with ``flags`` (``O_CREAT`` creates it 0666 less the
    umask) never through a symbolic link (``O_NOFOLLOW``) and never blocking (a named pipe
    opens at once, or not at all), checked on the descriptor to be a regular file; one line
    naming the path otherwise."""
    path = Path(path)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.ENOTDIR):  # a link, a pipe nobody reads...
            check_owned(path, hint)
            if exc.errno == errno.ELOOP:
                raise _link_error(path, hint) from None
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise write_error(path, exc) from None
        raise QuarlError(f"{path} cannot be read as {what} ({exc.strerror or exc})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise QuarlError(f"{path} is {_kind(mode)}, not a regular file: quarl writes only regular files there; {hint}")
    os.set_blocking(fd, True)
    return fd


def owned_folder(root: Path | str, *parts: str, hint: str = OUT_HINT) -> Path:
    """``root/PARTS...``, each part a real folder (made where missing) inside ``root`` (the
    output folder as the user named it, made too, a link there followed: the user's
    choice): a symbolic link or a file at any part is refused in one line naming it, so
    nothing quarl writes or removes there lands in a folder it did not make."""
    folder = Path(root)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_error(folder, exc) from None
    return _walk_folders(folder, parts, hint, make=True)


def check_folder(root: Path | str, *parts: str, hint: str = OUT_HINT) -> None:
    """:func:`owned_folder`'s check without making anything: each part of ``root/PARTS...``
    that is there is a real folder (checked before work that will write there)."""
    _walk_folders(Path(root), parts, hint, make=False)


def _walk_folders(folder: Path, parts: tuple[str, ...], hint: str, make: bool) -> Path:
    for part in Path(*parts).parts if parts else ():
        if part in ("..", "/"):
            raise ValueError(f"{part!r} is not a folder inside {folder}")
        folder = folder / part
        if make:
            try:
                os.mkdir(folder)
                continue
            except FileExistsError:
                pass
            except OSError as exc:
                raise write_error(folder, exc) from None
        try:
            info = os.lstat(folder)
        except FileNotFoundError:  # nothing there yet (a check): what is made later is made a folder
            return folder
        if stat.S_ISLNK(info.st_mode):
            raise _link_error(folder, hint)
        if not stat.S_ISDIR(info.st_mode):
            raise QuarlError(f"{folder} is {_kind(info.st_mode)}, not a folder: quarl writes a folder there; {hint}")
    return folder


def append_line(path: Path | str, line: str) -> None:
    """Append ``line`` (a newline added) to ``path`` and fsync it; when it cannot be written
    whole (ENOSPC, a file-size limit), the file is cut back to its length before, so it
    never ends in half a line, and the error is one line naming the file. A link or a
    named pipe at ``path`` is refused (:func:`open_owned`): never another file's end."""
    path = Path(path)
    fd = open_owned(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, "a log")
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
