"""Checkpoint formats are one registry (:mod:`quarl.policies.formats`), and CONTRIBUTING's
"add a checkpoint format" recipe is followed here end to end: a made-up format is added
with one registration (no other quarl file changes), loaded by ``quarl.load`` and run
through ``quarl ptq``, then removed. The formats whose code lives above the policies
package register themselves from above, and nothing in policies imports them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import quarl
from quarl.cli import app
from quarl.core.errors import QuarlError
from quarl.envs import EnvSpec, make_env
from quarl.policies import formats
from quarl.policies.base import Policy
from quarl.policies.checkpoint import Checkpoint, CheckpointFormat
from tests.conftest import zoo_run

SUFFIX = ".tiny.npz"


def _detect(path: Path) -> bool:
    return path.is_file() and path.name.endswith(SUFFIX)


def _load(path: Path, trust_pickle: bool = False) -> Checkpoint:
    """A made-up format: the arrays of a two-layer MLP and its env id, in one ``.npz``."""
    with np.load(path, allow_pickle=False) as arrays:
        weights = {name: torch.from_numpy(arrays[name].astype(np.float32)) for name in ("w0", "b0", "w1", "b1")}
        env_id = str(arrays["env_id"])
    first, last = nn.Linear(*weights["w0"].shape[::-1]), nn.Linear(*weights["w1"].shape[::-1])
    first.load_state_dict({"weight": weights["w0"], "bias": weights["b0"]})
    last.load_state_dict({"weight": weights["w1"], "bias": weights["b1"]})
    spec = EnvSpec(env_id)
    env = make_env(spec)
    policy = Policy(nn.Sequential(first, nn.ReLU(), last), env.observation_space, env.action_space, "argmax",
                    algo="tiny")
    env.close()
    return Checkpoint(policy=policy, env_spec=spec, algo="tiny", path=path)


@pytest.fixture
def tiny_format() -> Iterator[CheckpointFormat]:
    fmt = formats.register_format(CheckpointFormat("tiny", _detect, _load, "a made-up .tiny.npz"))
    try:
        yield fmt
    finally:
        formats.FORMATS.remove("tiny")


def _tiny_file(folder: Path) -> Path:
    """Pushes right when the pole falls right (angle plus angular velocity), else left."""
    w0 = np.zeros((4, 4), np.float32)
    w0[0, 2], w0[0, 3], w0[1, 2], w0[1, 3] = 1.0, 1.0, -1.0, -1.0
    w1 = np.zeros((2, 4), np.float32)
    w1[1, 0], w1[0, 1] = 1.0, 1.0
    path = folder / f"cartpole{SUFFIX}"
    np.savez(path, w0=w0, b0=np.zeros(4, np.float32), w1=w1, b1=np.zeros(2, np.float32), env_id=np.array("CartPole-v1"))
    return path


def test_a_made_up_format_is_one_registration_loaded_and_run_through_ptq(tiny_format: CheckpointFormat,
                                                                          tmp_path: Path) -> None:
    path = _tiny_file(tmp_path)
    assert next(iter(formats.FORMATS)) == "tiny" and formats.format_of(path) is tiny_format  # asked first
    agent = quarl.load(path)
    assert agent.algo == "tiny" and agent.env_spec == EnvSpec("CartPole-v1") and agent.format == "tiny"
    assert "tiny: a made-up .tiny.npz" in formats.describe_formats()  # its entry in the docs' list
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    np.testing.assert_array_equal(agent.policy.act(obs), (obs[:, 2] + obs[:, 3] > 0).astype(np.int64))
    r = CliRunner().invoke(app, ["ptq", str(path), "--precisions", "fp32,int8", "--episodes", "2",
                                 "--out", str(tmp_path / "out")], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert {row["precision"] for row in rows} == {"fp32", "int8"} and all(row["mean"] > 100 for row in rows)


def test_without_the_registration_the_file_is_refused_in_one_line(tmp_path: Path) -> None:
    path = _tiny_file(tmp_path)
    with pytest.raises(QuarlError, match=r"cartpole.tiny.npz is not a Stable-Baselines3 checkpoint: it lacks"):
        quarl.load(path)  # the zoo format claims any existing path no other format takes (an .npz is a zip)
    with pytest.raises(QuarlError, match=r"^checkpoint '.*nowhere' does not exist$"):
        quarl.load(tmp_path / "nowhere")  # a path no format claims


def test_the_order_of_claim_and_the_formats_registered_from_above() -> None:
    import quarl.checkpoints  # noqa: F401  (as quarl.api and the CLI import it)

    names = list(formats.FORMATS)
    assert names[-4:] == ["hub", "onnx", "legacy", "zoo"]  # the built-in ones, the zoo's claim asked last
    assert {"actorq-run", "qat"} <= set(names[:-4])  # registered from quarl.actorq and quarl.training
    assert formats.format_of("hf://sb3/ppo-CartPole-v1") is formats.FORMATS["hub"]
    assert formats.format_of("/nowhere/at/all.onnx") is None  # detect reads the disk, never raises


def test_the_docs_list_of_formats_is_the_registry() -> None:
    """quickstart.md's list of checkpoint formats is what its Python block prints: each
    registered format's name and ``describes``, in the order they are asked (no hand-written list)."""
    page = (Path(__file__).parents[1] / "docs" / "quickstart.md").read_text()
    marker = "<!-- made-by: tests/test_checkpoint_formats.py::test_the_docs_list_of_formats_is_the_registry -->"
    code = page.split(marker)[0].rsplit("```python\n", 1)[1].split("```")[0]
    shown = page.split(marker, 1)[1].split("```\n", 1)[1].split("```")[0]
    assert _fresh(code) + "\n" == shown


def _fresh(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_policies_imports_nothing_above_it_and_the_entry_points_register_every_format() -> None:
    below = _fresh("import sys, quarl.policies.formats as f; print(list(f.FORMATS), "
                   "sorted(m for m in sys.modules if m.startswith(('quarl.actorq', 'quarl.training'))))")
    assert below == "['hub', 'onnx', 'legacy', 'zoo'] []"
    names = _fresh("import quarl.api; from quarl.policies.formats import FORMATS; print(sorted(FORMATS))")
    assert names == "['actorq-run', 'hub', 'legacy', 'onnx', 'qat', 'recovered', 'zoo']"
    # every caller above policies loads through quarl.checkpoints (which imports the formats from above)
    src = Path(quarl.__file__).parent
    direct = sorted(str(p.relative_to(src)) for p in src.rglob("*.py")
                    if "formats import load_checkpoint" in p.read_text() or "formats.load_checkpoint(" in p.read_text())
    assert direct == ["checkpoints.py"]


def test_a_qat_folder_is_the_qat_formats_and_refused_by_the_zoo_format_alone(tmp_path: Path) -> None:
    from quarl.policies import zoo

    run = tmp_path / "ppo" / "CartPole-v1_1"
    shutil.copytree(zoo_run("ppo", "CartPole-v1"), run)
    config_dir = next(run.rglob("config.yml")).parent
    (config_dir / zoo.QAT_FILE).write_text("{}")
    import quarl.checkpoints  # noqa: F401

    assert formats.format_of(run) is formats.FORMATS["qat"]
    with pytest.raises(QuarlError, match=r"qat.json: a quantization-aware trained run.*quarl.checkpoints"):
        zoo.load(run)
    with pytest.raises(QuarlError, match=r"qat.json"):  # read as a typed record: {} lacks its fields
        quarl.load(run)


def test_a_loaded_checkpoint_says_its_format_and_carries_its_payload() -> None:
    """What a command asks instead of sniffing the path: the format that loaded it and that
    format's typed payload (an export's model and sidecar as read, once)."""
    from quarl.checkpoints import load_checkpoint
    from quarl.policies.onnx_artifact import ExportedModel

    folder = Path(__file__).parent / "data" / "recovery_v1" / "folder"  # written by an earlier quarl recover
    exported = load_checkpoint(folder / "export")
    payload = exported.payload_of(ExportedModel)
    assert exported.format == "onnx" and payload is not None and payload.model.name == "policy.onnx"
    assert payload.sidecar.algo == exported.algo and payload.sidecar.quant == exported.policy.meta["quant"]
    original = load_checkpoint(folder / "CartPole-v1" / "original.zip")
    assert original.format == "zoo" and original.payload is None and original.payload_of(ExportedModel) is None
    assert load_checkpoint(folder).format == "recovered"


def test_an_export_sidecar_is_written_and_read_as_one_record(tmp_path: Path) -> None:
    """quarl export writes its sidecar through SidecarRecord (its fields, in its order) and the
    onnx format reads back the very record written."""
    import json

    from quarl.checkpoints import load_checkpoint
    from quarl.export.artifact import export_policy
    from quarl.policies.onnx_artifact import SidecarRecord, read_sidecar

    agent = load_checkpoint(Path(__file__).parent / "data" / "recovery_v1" / "folder" / "CartPole-v1" / "original.zip")
    written = export_policy(agent.policy, "fp32", tmp_path / "policy", env_spec=EnvSpec("CartPole-v1"))
    on_disk = json.loads((tmp_path / "policy.json").read_text())
    assert on_disk == json.loads(json.dumps(written)) and list(on_disk) == [f for f in SidecarRecord.model_fields
                                                                          if f in on_disk]
    read = read_sidecar(tmp_path / "policy.json")
    assert json.loads(read.model_dump_json(exclude_unset=True)) == on_disk
