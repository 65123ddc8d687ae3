"""QUARL_CPU_KIND: quarl answers as a CPU with AVX2 only where asked (its probes only), keys
what it stores by the kind, records it in provenance, and refuses a kind it does not know in
one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import run_cli
from torch import nn

from quarl.core.cpu_kind import CPU_KINDS, cpu_kind
from quarl.core.errors import QuarlError
from quarl.core.provenance import provenance, whole_provenance
from quarl.quant import modes
from quarl.quant.backends import onnxruntime as ortb
from quarl.quantization import choice_cache
from quarl.quantization.config import QuantConfig

AGENT = Path(__file__).parent / "data" / "recovery_v1" / "folder" / "CartPole-v1" / "original.zip"


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 2)).eval()


def test_avx2_answers_as_a_cpu_without_vnni_or_exact_int8_matmulnbits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUARL_CPU_KIND", "avx2")
    assert cpu_kind() == "avx2" and not ortb.has_vnni()
    assert modes.int8_compute(8) == modes.int8_compute(4) == "inexact"
    assert QuantConfig("int8").resolved().int8_weights == "asymmetric"
    with pytest.raises(QuarlError, match="symmetric needs a CPU with VNNI"):
        QuantConfig("int8", int8_weights="symmetric").resolved()
    for bits in (8, 4):  # the block modes are refused with their reason and run as their fallbacks
        assert "not exact" in (modes.MODES[f"int{bits}-block"].unsupported(_net()) or "")
        assert modes.MODES[f"int{bits}-block"].runnable(_net()) is modes.MODES[f"int{bits}-weight-only"]
    assert modes.MODES["int8-dyn-channel"].runnable(_net()) is modes.MODES["int8-dyn-channel"]


def test_native_answers_what_the_probes_find(monkeypatch: pytest.MonkeyPatch) -> None:
    for value in ("native", "", " Native "):
        monkeypatch.setenv("QUARL_CPU_KIND", value)
        assert cpu_kind() == "native"
        assert ortb.has_vnni() == ortb._cpuinfo_vnni()
        assert modes.int8_compute(4) == modes.probe_int8_compute(4)
        assert QuantConfig("int8").resolved().int8_weights == ("symmetric" if ortb._cpuinfo_vnni() else "asymmetric")
    monkeypatch.delenv("QUARL_CPU_KIND")
    assert cpu_kind() == "native"


def test_the_kind_keys_stored_results_and_choices_and_provenance_records_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    monkeypatch.setenv("QUARL_CPU_KIND", "native")
    native_runtime, native_provenance = modes.runtime_key(), provenance()
    states = np.zeros((4, 4), np.float32)
    native_choice = choice_cache.choice_key("policy", {"bits": 8}, states, None)
    # native keys are the keys quarl stored before the kind existed: no field of it
    assert set(native_runtime) == {"onnxruntime", "cpu", "vnni"} and "cpu_kind" not in native_provenance
    monkeypatch.setenv("QUARL_CPU_KIND", "avx2")
    avx2_runtime, avx2_provenance = modes.runtime_key(), provenance()
    assert avx2_runtime == {**native_runtime, "vnni": "False", "cpu_kind": "avx2"}
    assert choice_cache.choice_key("policy", {"bits": 8}, states, None) not in (native_choice, None)
    # the CPU and its flags stay the real ones; the kind quarl answered as is beside them
    assert avx2_provenance == {**native_provenance, "cpu_kind": "avx2"}
    assert (whole_provenance(avx2_provenance) == avx2_provenance
            and whole_provenance(native_provenance) == native_provenance)


def test_a_kind_quarl_does_not_know_is_one_line_naming_it_and_the_kinds(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    monkeypatch.setenv("QUARL_CPU_KIND", "avx512")
    with pytest.raises(QuarlError) as refused:
        cpu_kind()
    assert str(refused.value) == f"QUARL_CPU_KIND='avx512' is not a CPU kind: allowed {', '.join(CPU_KINDS)}"
    assert list(CPU_KINDS) == ["native", "avx2"]
    with pytest.raises(QuarlError, match="QUARL_CPU_KIND='avx512'"):
        ortb.has_vnni()
    with pytest.raises(QuarlError, match="QUARL_CPU_KIND='avx512'"):
        provenance()
    result = run_cli("ptq", str(AGENT), "--env", "CartPole-v1", "--precisions", "int8", "--episodes", "2",
                     "--out", str(tmp_path))
    assert result.returncode == 2 and "Traceback" not in result.stderr  # the lines before it are progress bars
    assert [line for line in result.stderr.splitlines() if line.startswith("error")] == [
        f"error: QUARL_CPU_KIND='avx512' is not a CPU kind: allowed {', '.join(CPU_KINDS)}"]
