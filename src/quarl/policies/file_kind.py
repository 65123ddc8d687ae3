"""A file given as a policy that no built-in format reads, told by its name and first bytes
(nothing else is read, nothing heavy imported): the zoo format, which claims any existing
path, refuses it in these words, and the CLI says them before torch loads."""

from __future__ import annotations

from pathlib import Path

POLICY_KINDS = ("an SB3 .zip, an RL Zoo run folder, a legacy stable-baselines .pkl, hf://ORG/REPO, a quarl actorq run "
                "folder or a quarl export (its folder or .onnx)")
"""What a command takes as a policy, as a refusal says it."""
READ_BY_NAME = (".zip", ".pkl", ".onnx")
"""Suffixes a format claims by the name: the zoo's zip (its own refusal names what is wrong
inside), the legacy pickle, an export's model."""
ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")


def not_a_policy(path: Path) -> str | None:
    """Why the regular file ``path`` is no policy (None: a folder, a name a format claims, or a
    zip, which the zoo format reads): an export's sidecar (its ``.onnx`` beside it) says to give
    the export; any other file names what a policy is."""
    if not path.is_file() or path.suffix.lower() in READ_BY_NAME:
        return None
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError:  # unreadable: the format's own open says so
        return None
    if head in ZIP_MAGIC:
        return None
    model = path.with_suffix(".onnx")
    if path.suffix.lower() == ".json" and model.is_file():
        return (f"{path} is the sidecar of a quarl export, not a policy: give the export folder "
                f"({path.parent}) or its model ({model})")
    return f"{path} is not a policy (not a zip, nor a name a format reads): give {POLICY_KINDS}"
