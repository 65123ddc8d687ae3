"""examples/run_onnx_policy.py, the export run by ONNX Runtime and NumPy alone, plays the
returns quarl's own evaluation of the export gives, episode by episode: a discrete head, a
VecNormalize'd continuous one and a tanh-squashed one (docs/deploy.md shows it)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, run_cli, zoo_run


def _example():
    spec = importlib.util.spec_from_file_location("run_onnx_policy", ROOT / "examples" / "run_onnx_policy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("algo, env, precision", [("ppo", "LunarLander-v2", "int8"),
                                                  ("ppo", "MountainCarContinuous-v0", "int8"),
                                                  ("sac", "Pendulum-v1", "fp32")])
def test_the_standalone_script_plays_quarls_returns(tmp_path: Path, algo: str, env: str, precision: str) -> None:
    import quarl

    out = tmp_path / "export"
    result = run_cli("export", str(zoo_run(algo, env)), "--precision", precision, "--out", str(out))
    assert result.returncode == 0, result.stderr
    example = _example()
    mine = example.play(out, episodes=3, seed=0)
    theirs = quarl.evaluate(quarl.load(out), episodes=3, seed=0).returns
    assert np.allclose(mine, theirs, rtol=0, atol=1e-6), (mine, theirs)
    head = example.OnnxPolicy(out).head
    assert head == {"ppo LunarLander-v2": "argmax", "ppo MountainCarContinuous-v0": "clip",
                    "sac Pendulum-v1": "unscale"}[f"{algo} {env}"]


def test_the_script_runs_as_a_program_and_refuses_an_env_it_cannot_rebuild(tmp_path: Path) -> None:
    import json
    import subprocess

    out = tmp_path / "export"
    assert run_cli("export", str(zoo_run("ppo", "CartPole-v1")), "--precision", "fp32",
                   "--out", str(out)).returncode == 0
    printed = subprocess.run([sys.executable, str(ROOT / "examples" / "run_onnx_policy.py"), str(out), "--episodes",
                              "2"], capture_output=True, text=True, check=True).stdout
    assert printed.splitlines()[-1] == "mean return 500.00 over 2 episodes"
    meta = json.loads((out / "policy.json").read_text())
    meta["env"]["frame_stack"] = 4
    (out / "policy.json").write_text(json.dumps(meta))
    refused = subprocess.run([sys.executable, str(ROOT / "examples" / "run_onnx_policy.py"), str(out)],
                             capture_output=True, text=True)
    assert refused.returncode != 0 and "frame stack 4" in refused.stderr


def test_the_script_imports_only_onnx_runtime_numpy_and_gymnasium() -> None:
    import ast

    tree = ast.parse((ROOT / "examples" / "run_onnx_policy.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "argparse", "json", "pathlib", "numpy", "onnxruntime", "gymnasium"}, imported


def test_the_docs_block(tmp_path: Path) -> None:
    """docs/deploy.md's block: the commands it shows print what it shows (an fp32 export: no
    int mode the CPU chooses)."""
    import subprocess

    page = (ROOT / "docs" / "deploy.md").read_text()
    section = page[page.index("### Without quarl"):]
    shown = section.split("<!-- made-by: tests/test_onnx_example.py::test_the_docs_block -->\n\n```\n", 1)[1]
    shown = shown.split("```", 1)[0]
    out = tmp_path / "lunar-fp32"
    assert run_cli("export", str(zoo_run("ppo", "LunarLander-v2")), "--precision", "fp32", "--out",
                   str(out)).returncode == 0
    printed = subprocess.run([sys.executable, str(ROOT / "examples" / "run_onnx_policy.py"), str(out), "--episodes",
                              "3"], capture_output=True, text=True, check=True).stdout
    assert printed == shown
