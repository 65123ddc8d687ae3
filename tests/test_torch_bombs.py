"""Torch files are bounded by what they inflate to before torch reads them (issue 46): a
1.2 MB file holding one DEFLATE record that inflates to 1.2 GB (torch's reader allocates a
record's size before it inflates it) is refused in one line, under the memory bound, in
each place quarl reads one: recover's resume state, an ActorQ run's checkpoint and policy,
an SB3 zip's policy.pth and a training checkpoint. Each case runs the console script in a
subprocess and reads its peak memory (tests.test_crafted_files._popen_peak)."""

from __future__ import annotations

import io
import json
import struct
import zipfile
import zlib
from pathlib import Path

import gymnasium as gym
import pytest
import stable_baselines3 as sb3
import torch

from quarl.core.errors import QuarlError
from quarl.core.limits import load_torch
from tests.test_crafted_files import PEAK_LIMIT_MB, _popen_peak

BOMB_MB = 1200


def _deflated_zeros(megabytes: int) -> tuple[bytes, int, int]:
    """A raw DEFLATE stream of ``megabytes`` MiB of zeros (about 1 KB a MiB), its CRC-32 and
    size: one MiB deflated after a full flush is the same bytes every time, so it is repeated
    rather than compressed a gigabyte at a time."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = bytes(1 << 20)
    piece = deflate.compress(block) + deflate.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(megabytes):
        crc = zlib.crc32(block, crc)
    return piece * megabytes + deflate.flush(zlib.Z_FINISH), crc, megabytes << 20


def _zip(records: list[tuple[str, bytes, int, int, int]], prefix: bytes = b"") -> bytes:
    """A zip of (name, stored bytes, method, crc, inflated size) records, written by hand
    (zipfile cannot write a stream it did not deflate itself)."""
    out = io.BytesIO()
    out.write(prefix)
    central = []
    for name, body, method, crc, size in records:
        raw, offset = name.encode(), out.tell() - len(prefix)
        out.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0, crc, len(body), size, len(raw), 0)
                  + raw + body)
        central.append(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0, crc, len(body), size,
                                   len(raw), 0, 0, 0, 0, 0, offset) + raw)
    start = out.tell() - len(prefix)
    directory = b"".join(central)
    out.write(directory)
    out.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(central), len(central), len(directory), start, 0))
    return out.getvalue()


def _bombed(saved: bytes, megabytes: int = BOMB_MB) -> bytes:
    """``saved`` (what torch.save wrote) with its largest tensor record replaced by a DEFLATE
    record inflating to ``megabytes`` MiB: the same records, the same pickle, 1 KB per MiB."""
    with zipfile.ZipFile(io.BytesIO(saved)) as archive:
        infos = archive.infolist()
        target = max((i for i in infos if "/data/" in i.filename), key=lambda i: i.file_size).filename
        records = []
        for info in infos:
            if info.filename == target:
                body, crc, size = _deflated_zeros(megabytes)
                records.append((info.filename, body, 8, crc, size))
            else:
                data = archive.read(info.filename)
                records.append((info.filename, data, 0, zlib.crc32(data), len(data)))
    return _zip(records)


def _saved(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _sb3_zip(path: Path, policy_pth: bytes | None = None, steps: int = 0) -> Path:
    """A PPO CartPole zip as SB3 saves it (at ``steps``), its policy.pth replaced where given."""
    model = sb3.PPO("MlpPolicy", gym.make("CartPole-v1"), seed=0, device="cpu", n_steps=64)
    model.num_timesteps = steps
    model.save(path)
    if policy_pth is not None:
        with zipfile.ZipFile(path) as archive:
            entries = {name: archive.read(name) for name in archive.namelist()}
        entries["policy.pth"] = policy_pth
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
            for name, data in entries.items():
                archive.writestr(name, data)
    return path


def _policy_pth_bomb(tmp_path: Path) -> bytes:
    with zipfile.ZipFile(_sb3_zip(tmp_path / "plain.zip")) as archive:
        return _bombed(archive.read("policy.pth"))


def test_the_bomb_is_what_the_issue_says(tmp_path: Path) -> None:
    """The crafted file is 1.2 MB and torch's reader would inflate 1.2 GB from it (it says
    so in its records' sizes): the cases below are the real thing."""
    bomb = _bombed(_saved({"w": torch.zeros(3)}))
    assert len(bomb) < 1.3e6
    with zipfile.ZipFile(io.BytesIO(bomb)) as archive:
        assert sum(i.file_size for i in archive.infolist()) > BOMB_MB << 20
    with pytest.raises(QuarlError, match=r"inflate to 1,258,29\d,\d+ bytes \('archive/data/0': 1,258,291,200 from "
                                         r"1,24\d,\d+\), more than the 10,000,000 allowed for a test: refused"):
        load_torch(bomb, 10_000_000, "a test", "bomb.pt")


def _recover_case(tiny_run: Path, tmp_path: Path) -> list[str]:
    out = tmp_path / "rec"
    (out / ".recover").mkdir(parents=True)
    state = {"format": 1, "states": torch.zeros(64, 4), "heldout": torch.zeros(16, 4)}
    (out / ".recover" / "state.pt").write_bytes(_bombed(_saved(state)))
    return ["recover", str(tiny_run), "--precision", "int8", "--out", str(out)]


def _actorq_checkpoint_case(tiny_run: Path, tmp_path: Path) -> list[str]:
    from quarl.actorq.algorithms import make_learner
    from quarl.actorq.config import ActorQConfig

    out = tmp_path / "aq"
    out.mkdir()
    config = ActorQConfig.flat("CartPole-v1", local=True, out=out, policy_layers=(8,))
    learner = make_learner(config, 4, 2)
    blob = {"learner": learner.state_dict(), "state": {}, "limiter": (0, 0), "replay": None, "config": config.to_json()}
    (out / "checkpoint.pt").write_bytes(_bombed(_saved(blob)))
    return ["actorq", "run", "CartPole-v1", "--local", "--resume", "--policy-layers", "8", "--out", str(out)]


def _actorq_policy_case(tiny_run: Path, tmp_path: Path) -> list[str]:
    run = tmp_path / "aq-run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"config": {"algo": "dqn", "env_id": "CartPole-v1"}}))
    sd = {"0.weight": torch.zeros(8, 4), "0.bias": torch.zeros(8), "2.weight": torch.zeros(2, 8),
          "2.bias": torch.zeros(2)}
    (run / "policy.pt").write_bytes(_bombed(_saved(sd)))
    return ["ptq", str(run), "--precisions", "fp32", "--episodes", "1", "--out", str(tmp_path / "o")]


def _sb3_policy_case(tiny_run: Path, tmp_path: Path) -> list[str]:
    crafted = _sb3_zip(tmp_path / "bomb.zip", _policy_pth_bomb(tmp_path))
    return ["ptq", str(crafted), "--env", "CartPole-v1", "--precisions", "fp32", "--episodes", "1",
            "--out", str(tmp_path / "o")]


def _training_checkpoint_case(tiny_run: Path, tmp_path: Path) -> list[str]:
    run = tmp_path / "train" / "ppo" / "CartPole-v1_1"
    run.mkdir(parents=True)
    _sb3_zip(run / "rl_model_64_steps.zip", _policy_pth_bomb(tmp_path), steps=64)
    return ["train", "ppo", "CartPole-v1", "-n", "128", "--resume", "--out", str(tmp_path / "train"),
            "--hp", "n_steps=64", "--hp", "batch_size=64", "--hp", "n_envs=1"]


@pytest.mark.parametrize("case,message", [
    (_recover_case, r"state.pt: its \d+ records inflate to 1,2\d\d,\d+,\d+ bytes .*more than the [\d,]+ allowed for "
                    r"a recovery state: refused \(a zip bomb\?\): remove it to start afresh"),
    (_actorq_checkpoint_case, r"checkpoint.pt: its \d+ records inflate to .* allowed for this run's ActorQ checkpoint"),
    (_actorq_policy_case, r"policy.pt: its \d+ records inflate to .* allowed for an ActorQ policy: refused"),
    (_sb3_policy_case, r"bomb.zip: policy.pth: its \d+ records inflate to .* allowed for an SB3 policy: refused"),
    (_training_checkpoint_case, r"rl_model_64_steps.zip:policy.pth: its \d+ records inflate to .* allowed for a "
                                r"training checkpoint's tensors: refused"),
])
def test_a_torch_file_inflating_to_a_gigabyte_is_refused_unread(tiny_run: Path, tmp_path: Path, case,
                                                               message: str) -> None:
    """Each took 1.5 GB or more before torch raised its own error (or a traceback): now
    one line naming the file, what it inflates to and the cap, well under 1 GB."""
    import re

    code, err, peak = _popen_peak(*case(tiny_run, tmp_path))
    assert peak < PEAK_LIMIT_MB, (peak, err[-500:])
    errors = [line for line in err.splitlines() if line.startswith("error")]  # actorq says first what it starts
    assert code == 2 and "Traceback" not in err and len(errors) == 1 and re.search(message, errors[0]), err[-1500:]


def test_real_torch_files_load_through_the_bound_unchanged(tmp_path: Path) -> None:
    """What torch.save wrote loads as torch.load reads it, from a path and from bytes."""
    state = {"w": torch.arange(12.0).reshape(3, 4), "nested": {"steps": 5, "m": [torch.ones(2), torch.zeros(1)]}}
    path = tmp_path / "s.pt"
    torch.save(state, path)
    for source in (path, path.read_bytes()):
        loaded = load_torch(source, 10_000, "a test")
        assert torch.equal(loaded["w"], state["w"]) and loaded["nested"]["steps"] == 5
        assert torch.equal(loaded["nested"]["m"][0], torch.ones(2))
    with pytest.raises(QuarlError, match=r"s.pt has \d+ bytes, more than the 100 allowed for a test: refused"):
        load_torch(path, 100, "a test")


def test_a_torch_zip_with_bytes_before_it_is_refused(tmp_path: Path) -> None:
    """zipfile finds a directory after prepended bytes; torch's reader reads the offsets as
    written, where a second, crafted directory may lie: the two would see other records."""
    saved = _saved({"w": torch.zeros(3)})
    with zipfile.ZipFile(io.BytesIO(saved)) as archive:
        records = [(i.filename, archive.read(i.filename), 0, i.CRC, i.file_size) for i in archive.infolist()]
    crafted = _zip(records, prefix=b"PK\x03\x04" + bytes(60))
    with zipfile.ZipFile(io.BytesIO(crafted)) as archive:
        assert archive.testzip() is None  # zipfile reads it
    with pytest.raises(QuarlError, match="does not end where its end record begins .* bytes added before or inside"):
        load_torch(crafted, 10_000, "a test", "crafted.pt")


def test_a_zip_directory_of_too_many_entries_is_refused_before_zipfile_reads_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory listing more entries than the cap is refused from its end record, before
    zipfile builds an object for each (a 100 MB directory would take gigabytes); the cap is
    lowered to 1,000 so the zip is small."""
    from quarl.core import limits

    assert limits.ZIP_ENTRIES == 100_000
    monkeypatch.setattr(limits, "ZIP_ENTRIES", 1_000)
    read: list[object] = []
    monkeypatch.setattr(zipfile.ZipFile, "_RealGetContents", lambda self: read.append(self))  # zipfile's reader
    records = [(f"r{i}", b"", 0, 0, 0) for i in range(1_001)]
    path = tmp_path / "many.zip"
    path.write_bytes(_zip(records))
    with pytest.raises(QuarlError, match=r"lists 1,001 entries in 49,941 bytes: more than the 1,000 entries"):
        limits.open_zip(path, "an SB3 checkpoint")
    with pytest.raises(QuarlError, match=r"lists 1,001 entries"):
        load_torch(path, 10**9, "a test")
    assert not read  # zipfile never read the directory
    monkeypatch.undo()
    (tmp_path / "few.zip").write_bytes(_zip(records[:1_000]))
    with limits.open_zip(tmp_path / "few.zip", "an SB3 checkpoint") as archive:
        assert len(archive.namelist()) == 1_000


def test_a_zero_stride_view_or_deep_nesting_in_any_torch_file_is_refused(tmp_path: Path) -> None:
    """A 10^9-row view of one value in a nested checkpoint (not only a flat state dict),
    and containers nested past the bound, are refused after loading, before any use."""
    view = {"replay": {"data": {"obs": torch.zeros(1).expand(10**9, 4)}}}
    with pytest.raises(QuarlError, match=r"tensor 'replay.data.obs' claims shape \(1000000000, 4\) \(4000000000 "
                                         r"values\) but the file holds 1: refused as a test"):
        load_torch(_saved(view), 10_000, "a test")
    deep: object = torch.zeros(1)
    for _ in range(40):
        deep = [deep]
    with pytest.raises(QuarlError, match="containers nested more than 32 deep"):
        load_torch(_saved(deep), 10_000, "a test")
