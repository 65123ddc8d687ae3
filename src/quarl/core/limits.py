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
  built (:func:`check_layer_sizes`).

``QUARL_MAX_PARAMETERS`` raises the parameter cap for a policy that really is that big.
"""

from __future__ import annotations

import os
import stat
import struct
import zipfile
import zlib
from pathlib import Path
from typing import BinaryIO, Iterable, Mapping

import torch

from quarl.core.errors import QuarlError

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
    """The parameter cap: ``QUARL_MAX_PARAMETERS`` or :data:`DEFAULT_MAX_PARAMETERS`."""
    text = os.environ.get("QUARL_MAX_PARAMETERS", "")
    if not text:
        return DEFAULT_MAX_PARAMETERS
    try:
        value = int(text)
    except ValueError:
        raise QuarlError(f"QUARL_MAX_PARAMETERS={text!r} is not a whole number of parameters") from None
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
    when it is not a zip or larger than :func:`model_file_cap`."""
    check_file_size(path, model_file_cap(), what, within)
    fh = open_regular(path, what, within)
    try:
        return _OwnedZip(fh)
    except _CORRUPT_ZIP as exc:
        fh.close()
        raise QuarlError(f"{path} is not a readable zip ({str(exc).splitlines()[0][:80] if str(exc) else exc.__class__.__name__}): "
                         f"refused as {what}") from None


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


def model_file_cap() -> int:
    """Bytes a model file (a legacy pickle, an ONNX model, a tensor file) may have: the
    parameter cap's fp32 weights and room for the rest."""
    return 4 * max_parameters() + ENTRY_FLOOR


def check_tensors(tensors: Mapping[str, torch.Tensor], where: str) -> None:
    """Each tensor holds the values its shape claims and only finite ones; all together at
    most :func:`max_parameters` values. Call before building anything from them."""
    total = 0
    cap = max_parameters()
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise QuarlError(f"{where}: {name!r} is a {type(t).__name__}, not a tensor")
        held = t.untyped_storage().nbytes() // max(t.element_size(), 1)
        if t.numel() > held:
            raise QuarlError(f"{where}: tensor {name!r} claims shape {tuple(t.shape)} ({t.numel()} values) but the file "
                             f"holds {held}: refused")
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
    params = sum((a + 1) * b for a, b in zip(sizes, sizes[1:]))
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
