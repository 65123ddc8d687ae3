"""Bounded resources for files a user hands over: a crafted file never decides how much
memory quarl takes. Every check runs before the memory is taken and fails with one line
(:class:`~quarl.core.errors.QuarlError`) naming what was refused and the limit.

- zip entries are inflated through a counting stream, against both their declared size and
  a cap (:func:`read_zip_entry`): a 3 MB zip that inflates to 3 GB stops at the cap;
- tensors must hold the values their shape claims (no zero-stride views of one value
  posing as a 10^8-wide layer), all together at most :func:`max_parameters`, and finite
  (:func:`check_tensors`);
- files are regular files (:func:`regular_file`: a named pipe or a device would block or
  never end) and are read whole at most their cap (:func:`read_capped`): side files a few
  kilobytes long in practice get a cap of a megabyte or so, model files
  :func:`model_file_cap`;
- a network described by sizes (``--policy-layers``, ``net_arch``) is priced before it is
  built (:func:`check_layer_sizes`);
- a zip's central directory is bounded before zipfile reads it (:func:`zip_directory`: an
  object per entry), and a torch file (torch.save's zip) is loaded only through
  :func:`load_torch`, which adds up what its records inflate to before ``torch.load``: a
  1 MB file whose one DEFLATE record inflates to 1.2 GB is refused unread.

``QUARL_MAX_PARAMETERS`` raises the parameter cap for a policy that really is that big.
"""

from __future__ import annotations

import os
import stat
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from quarl.core.errors import QuarlError

if TYPE_CHECKING:  # torch loads where a torch file is read: a command refusing its input answers without it
    import torch

DEFAULT_MAX_PARAMETERS = 64_000_000
"""256 MB of fp32 weights: 7x the largest policy in the paper (3 x 2048 MLP, 8.4M) and 37x
NatureCNN (1.7M)."""
ENTRY_RATIO = 20
"""A zip entry may inflate to this many times its compressed size (tensors of floats
compress 1.1-2x; text a few times)..."""
ENTRY_FLOOR = 64 * 2**20
"""...or to 64 MB, whichever is larger, and never past the bytes of the parameter cap."""
CHUNK = 2**20


def max_parameters() -> int:
    """The parameter cap: ``QUARL_MAX_PARAMETERS`` or :data:`DEFAULT_MAX_PARAMETERS`; a cap
    whose fp32 weights this machine's memory cannot hold is refused (10^30 let a
    10^18-parameter network through to torch's allocator)."""
    from quarl.core.validate import digits, shown

    text = os.environ.get("QUARL_MAX_PARAMETERS", "").strip()
    if not text:
        return DEFAULT_MAX_PARAMETERS
    if not digits(text):
        raise QuarlError(f"QUARL_MAX_PARAMETERS={shown(text)} is not a whole number of parameters")
    most = machine_memory() // 4
    if len(text.lstrip("0")) > len(str(most)) or int(text) > most:
        raise QuarlError(f"QUARL_MAX_PARAMETERS={shown(text)}: more fp32 parameters than this machine's "
                         f"{machine_memory() / 2**30:.1f} GiB of memory hold (at most {most:,})")
    value = int(text)
    if value < 1:
        raise QuarlError(f"QUARL_MAX_PARAMETERS={value} must be at least 1")
    return value


def entry_cap(info: zipfile.ZipInfo) -> int:
    """Bytes a zip entry may inflate to (see :data:`ENTRY_RATIO`)."""
    return min(max(ENTRY_FLOOR, ENTRY_RATIO * info.compress_size), 4 * max_parameters() + ENTRY_FLOOR)


_CORRUPT_ZIP = (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, NotImplementedError, RuntimeError,
                struct.error, OverflowError)
"""What zipfile and its decompressors raise for a truncated or crafted archive (a bad CRC,
a cut stream, an unknown compression method, an encrypted entry, a header past the end)."""


def read_zip_entry(archive: zipfile.ZipFile, name: str, where: str) -> bytes:
    """The entry's bytes, inflated at most :func:`entry_cap` bytes: refused when its
    declared size is larger, or when it inflates past the cap whatever it declared; a
    missing entry, or one that does not inflate to what its header says (truncated, bit
    flips, an unknown method), is refused in one line too."""
    try:
        info = archive.getinfo(name)
    except KeyError:
        raise QuarlError(f"{where} has no entry {name!r}: refused") from None
    cap = entry_cap(info)
    if info.file_size > cap:
        raise QuarlError(f"{where}: entry {name!r} declares {info.file_size} bytes inflated from {info.compress_size}: "
                         f"more than the {cap} allowed (a zip bomb?)")
    parts, total = [], 0
    try:
        with archive.open(info) as stream:
            while True:
                chunk = stream.read(min(CHUNK, cap + 1 - total))
                if not chunk:
                    break
                total += len(chunk)
                if total > cap:
                    raise QuarlError(f"{where}: entry {name!r} inflates past {cap} bytes (it declared "
                                     f"{info.file_size}): refused (a zip bomb?)")
                parts.append(chunk)
    except _CORRUPT_ZIP as exc:
        raise QuarlError(f"{where}: entry {name!r} cannot be read ({exc.__class__.__name__}: "
                         f"{str(exc).splitlines()[0][:80] if str(exc) else 'corrupt'}): a truncated or damaged zip") \
            from None
    return b"".join(parts)


def regular_file(path: Path, what: str, within: Path | None = None) -> Path:
    """``path`` if it is a regular file (a symlink to one is followed): a named pipe, a
    device or a socket would block a read or never end, so each is refused in one line;
    with ``within``, a symlink that leads out of that folder is refused too (a run
    folder's side file is that run's own)."""
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise QuarlError(f"{path} does not exist") from None
    except OSError as exc:
        raise QuarlError(f"{path} cannot be read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = ("a named pipe" if stat.S_ISFIFO(info.st_mode) else "a device" if stat.S_ISCHR(info.st_mode)
                or stat.S_ISBLK(info.st_mode) else "a socket" if stat.S_ISSOCK(info.st_mode)
                else "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file")
        raise QuarlError(f"{path} is {kind}, not a regular file: refused as {what}")
    if within is not None and path.is_symlink():
        target, root = path.resolve(), Path(within).resolve()
        if root not in target.parents:
            raise QuarlError(f"{path} is a symlink out of {within} (to {target}): refused as {what}")
    return path


def open_regular(path: Path, what: str, within: Path | None = None) -> BinaryIO:
    """``path`` opened for reading, checked to be a regular file on the descriptor itself
    (the file cannot be swapped for a pipe between the check and the open: the open does
    not block and the descriptor is what is checked)."""
    regular_file(path, what, within)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise QuarlError(f"{path} cannot be read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise QuarlError(f"{path} is not a regular file: refused as {what}")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def check_file_size(path: Path, cap: int, what: str, within: Path | None = None) -> None:
    """Refuse ``path`` in one line when it is not a regular file (:func:`regular_file`) or
    holds more than ``cap`` bytes."""
    size = regular_file(path, what, within).stat().st_size
    if size > cap:
        raise QuarlError(f"{path} has {size} bytes, more than the {cap} allowed for {what}: refused")


def read_capped(path: Path, cap: int, what: str, within: Path | None = None) -> bytes:
    """The bytes of regular file ``path``, refused in one line when it holds more than ``cap``."""
    check_file_size(path, cap, what, within)
    with open_regular(path, what, within) as fh:
        data = fh.read(cap + 1)
    if len(data) > cap:  # grew after the check
        raise QuarlError(f"{path} has more than the {cap} bytes allowed for {what}: refused")
    return data


def open_zip(path: Path, what: str, within: Path | None = None) -> zipfile.ZipFile:
    """A zip archive read from regular file ``path`` (never a pipe), refused in one line
    when it is not a zip, larger than :func:`model_file_cap` or its directory is past
    :func:`zip_directory`'s bounds."""
    check_file_size(path, model_file_cap(), what, within)
    fh = open_regular(path, what, within)
    try:
        zip_directory(fh, str(path), what)
        return _OwnedZip(fh)
    except QuarlError:
        fh.close()
        raise
    except _CORRUPT_ZIP as exc:
        fh.close()
        detail = str(exc).splitlines()[0][:80] if str(exc) else exc.__class__.__name__
        raise QuarlError(f"{path} is not a readable zip ({detail}): refused as {what}") from None


class _OwnedZip(zipfile.ZipFile):
    """A ZipFile that closes the file it was handed when it closes (ZipFile leaves a passed
    file open: every checkpoint read held a descriptor until garbage collection)."""

    def __init__(self, fh: BinaryIO) -> None:
        self._owned = fh
        super().__init__(fh)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._owned.close()


ZIP_ENTRIES = 100_000
"""Entries a zip may list: an SB3 zip has about eight, a torch file one record per tensor
and a few of torch's own (a checkpoint with its optimizer, hundreds)."""
ZIP_DIRECTORY_CAP = 16 * 2**20
"""Bytes a zip's central directory may take (46 bytes and a name per entry): zipfile makes
an object of each entry, about 500 bytes, before any can be checked."""
_END = struct.Struct("<4s4H2LH")
_END64_LOCATOR = struct.Struct("<4sLQL")
_END64 = struct.Struct("<4sQ2H2L4Q")


def zip_directory(fh: BinaryIO, where: str, what: str) -> tuple[int, int] | None:
    """(entries, bytes) of the central directory of the zip open in ``fh``, read from its
    end record (and zip64's) before zipfile reads a directory entry; refused in one line
    past :data:`ZIP_ENTRIES` or :data:`ZIP_DIRECTORY_CAP`, or where the directory does not
    end where the end record begins (bytes before the archive or between its parts: zipfile
    and torch's reader would then read two different directories). None where no end
    record is found (not a zip: the reader says so)."""
    fh.seek(0, os.SEEK_END)
    length = fh.tell()
    tail_start = max(0, length - _END.size - 0xFFFF)
    fh.seek(tail_start)
    tail = fh.read(length - tail_start)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < _END.size:
        return None
    end = tail_start + at
    _, _, _, _, entries, size, offset, _ = _END.unpack_from(tail, at)
    if end >= _END64_LOCATOR.size:  # zip64's records, where present, say what the end record cannot
        fh.seek(end - _END64_LOCATOR.size)
        sig, _, end64, _ = _END64_LOCATOR.unpack(fh.read(_END64_LOCATOR.size))
        if sig == b"PK\x06\x07" and 0 <= end64 <= end - _END64.size:
            fh.seek(end64)
            record = fh.read(_END64.size)
            if record[:4] == b"PK\x06\x06":
                _, _, _, _, _, _, _, entries, size, offset = _END64.unpack(record)
                end = end64
    fh.seek(0)
    if entries > ZIP_ENTRIES or size > ZIP_DIRECTORY_CAP:
        raise QuarlError(f"{where}: its zip directory lists {entries:,} entries in {size:,} bytes: more than the "
                         f"{ZIP_ENTRIES:,} entries ({ZIP_DIRECTORY_CAP:,} bytes) allowed for {what}: refused")
    if offset + size != end:
        raise QuarlError(f"{where}: its zip directory ({size:,} bytes at {offset:,}) does not end where its end record "
                         f"begins ({end:,}): bytes added before or inside the archive, refused as {what}")
    return entries, size


TORCH_DEPTH = 32
"""Containers a torch file may nest (a checkpoint's optimizer state is 5 deep)."""


def torch_file_cap(parameters: int = 0) -> int:
    """Bytes a torch file may inflate to where it holds ``parameters`` fp32 values at most
    (default: the parameter cap's, :func:`model_file_cap`), and room for the rest."""
    return 4 * (parameters or max_parameters()) + ENTRY_FLOOR


def load_torch(source: Path | bytes, cap: int, what: str, where: str | None = None,
               unreadable: Callable[[str], str] | None = None) -> Any:
    """``torch.load(weights_only=True)`` of a torch file (a path, or the bytes of a zip's
    entry), bounded before torch reads a record: at most ``cap`` bytes on disk and, for
    torch.save's zip, at most ``cap`` bytes in all its records inflate to (each record's
    size in the central directory, which torch's reader allocates before it inflates),
    at most :data:`ZIP_ENTRIES` records; after loading, every tensor holds the values its
    shape claims (no zero-stride view of one value posing as 10^9) in containers at most
    :data:`TORCH_DEPTH` deep. Every refusal is one line; where torch cannot read the file,
    ``unreadable(error class)`` is the line (default: "WHERE cannot be read as WHAT ...").
    An older torch's file (not a zip: pickles and raw storages, no compression) is bounded
    by its size."""
    import io

    import torch

    where = where or ("a torch file" if isinstance(source, bytes) else str(source))
    if isinstance(source, bytes):
        if len(source) > cap:
            raise QuarlError(f"{where} has {len(source):,} bytes, more than the {cap:,} allowed for {what}: refused")
        fh: BinaryIO = io.BytesIO(source)
    else:
        check_file_size(source, cap, what)
        fh = open_regular(source, what)
    with fh:
        if fh.read(4) == b"PK\x03\x04":  # torch.load's own test for its zip format
            _torch_records(fh, cap, what, where)
        fh.seek(0)
        try:  # tensors, numbers and strings only: nothing in the file can run code
            loaded = torch.load(fh, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises many types for a foreign or crafted file
            kind = exc.__class__.__name__
            raise QuarlError(unreadable(kind) if unreadable else f"{where} cannot be read as {what} of plain tensors "
                                                                 f"({kind}): refused") from None
    _check_loaded(loaded, what, where)
    return loaded


def _torch_records(fh: BinaryIO, cap: int, what: str, where: str) -> None:
    """Refuse a torch zip whose records would inflate past ``cap`` bytes in all."""
    zip_directory(fh, where, what)
    try:
        with zipfile.ZipFile(fh) as archive:  # a file handed over stays open
            infos = archive.infolist()
    except _CORRUPT_ZIP as exc:
        raise QuarlError(f"{where} is not a readable torch file ({exc.__class__.__name__}): "
                         f"refused as {what}") from None
    total = sum(info.file_size for info in infos)
    if total > cap:
        biggest = max(infos, key=lambda info: info.file_size)
        raise QuarlError(f"{where}: its {len(infos):,} records inflate to {total:,} bytes ({biggest.filename!r}: "
                         f"{biggest.file_size:,} from {biggest.compress_size:,}), more than the {cap:,} allowed for "
                         f"{what}: refused (a zip bomb?)")


def _check_loaded(loaded: Any, what: str, where: str) -> None:
    """Every tensor in ``loaded`` holds what its shape claims; containers at most
    :data:`TORCH_DEPTH` deep (walked without recursion)."""
    import torch

    stack: list[tuple[Any, str, int]] = [(loaded, "", 0)]
    while stack:
        value, name, depth = stack.pop()
        if isinstance(value, torch.Tensor):
            held = value.untyped_storage().nbytes() // max(value.element_size(), 1)
            if value.numel() > held:
                raise QuarlError(f"{where}: tensor {name or 'at the top'!r} claims shape {tuple(value.shape)} "
                                 f"({value.numel()} values) but the file holds {held}: refused as {what}")
            continue
        if isinstance(value, dict):
            children = list(value.items())
        elif isinstance(value, (list, tuple)):
            children = list(enumerate(value))
        else:
            continue
        if depth >= TORCH_DEPTH:
            raise QuarlError(f"{where}: containers nested more than {TORCH_DEPTH} deep (at {name!r}): "
                             f"refused as {what}")
        stack.extend((child, f"{name}.{key}" if name else str(key), depth + 1) for key, child in children)


def model_file_cap() -> int:
    """Bytes a model file (a legacy pickle, an ONNX model, a tensor file) may have: the
    parameter cap's fp32 weights and room for the rest."""
    return 4 * max_parameters() + ENTRY_FLOOR


def check_tensors(tensors: Mapping[str, torch.Tensor], where: str) -> None:
    """Each tensor holds the values its shape claims and only finite ones; all together at
    most :func:`max_parameters` values. Call before building anything from them."""
    import torch

    total = 0
    cap = max_parameters()
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise QuarlError(f"{where}: {name!r} is a {type(t).__name__}, not a tensor")
        held = t.untyped_storage().nbytes() // max(t.element_size(), 1)
        if t.numel() > held:
            raise QuarlError(f"{where}: tensor {name!r} claims shape {tuple(t.shape)} ({t.numel()} values) but the "
                             f"file holds {held}: refused")
        total += t.numel()
        if total > cap:
            raise QuarlError(f"{where}: more than {cap} parameters (at {name!r}): refused; set QUARL_MAX_PARAMETERS "
                             "to allow a bigger policy")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise QuarlError(f"{where}: tensor {name!r} holds {bad} non-finite values (NaN or inf): refused")


def check_layer_sizes(sizes: Iterable[int], what: str) -> None:
    """Sizes of a chain of dense layers (input, hidden..., output): each at least 1 and the
    weights together within :func:`max_parameters`, checked before any is allocated."""
    sizes = [int(s) for s in sizes]
    for s in sizes:
        if s < 1:
            raise QuarlError(f"{what}: layer size {s} must be at least 1")
    params = sum((a + 1) * b for a, b in zip(sizes, sizes[1:], strict=False))  # consecutive pairs: one fewer
    cap = max_parameters()
    if params > cap:
        raise QuarlError(f"{what}: layers {sizes} hold {params} parameters, more than the {cap} allowed "
                         "(set QUARL_MAX_PARAMETERS to allow more)")


def machine_memory() -> int:
    """Bytes of memory this process may take: the machine's physical memory (psutil, else
    ``sysconf``), or its cgroup's limit where that is lower (a container)."""
    try:
        import psutil

        total = int(psutil.virtual_memory().total)
    except Exception:  # psutil missing: the kernel's page counts
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            total = int(text)
    return total
