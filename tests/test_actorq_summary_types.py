"""ActorQ's summary typed (issue 39): its parts (machine, energy, actor_quant, provenance,
config) TypedDicts checked when read; what quarl wrote before they were typed reads back as
it was stored, a partial provenance reads as None, a part's field of the wrong type is refused
in one line. A checkpoint without a learner is refused in one line."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
import torch

from quarl.actorq.algorithms import make_learner
from quarl.actorq.config import ActorQConfig
from quarl.actorq.replay import RateLimiter, Replay
from quarl.actorq.snapshot import restore
from quarl.actorq.summary import ActorQSummary, whole_provenance
from quarl.core.cpu_kind import cpu_kind
from quarl.core.errors import QuarlError
from quarl.core.provenance import Provenance, provenance
from tests.conftest import actorq_summary

STORED = (
    '{"config":{"config_version":2,"env_id":"CartPole-v1","algo":"dqn","n_step":3,"target_update_period":100,'
    '"max_exploration":0.2,"replay":"prioritized","priority_exponent":0.6,"importance_exponent":0.4,"replay_s'
    'ize":1000000,"min_replay":100,"samples_per_insert":32.0,"samples_per_insert_tolerance":0.1,"actors":1,"a'
    'ctor_precision":"int8","wire_bits":32,"update_period":300,"push_period":100,"policy_layers":[32,32],"gam'
    'ma":0.99,"batch_size":32,"learning_rate":0.0001,"target_reward":1000000000.0,"max_minutes":1.0,"max_env_'
    'steps":400,"eval_every_s":10.0,"eval_every_steps":null,"eval_episodes":2,"chunk_steps":100,"checkpoint_e'
    'very_s":60.0,"checkpoint_replay":true,"seed":0,"out":"/tmp/aqrun_old","local":true,"address":null,"learn'
    'er_device":"cpu"},"machine":{"cpu":"AMD EPYC","cores":2,"gpu":null},"target_reward":1000000000.0,"reache'
    'd":false,"time_to_reward_s":null,"elapsed_s":0.417730491997645,"final_running_mean":9.5,"evals":[[0.0815'
    '9109799817088,1,9.5,0]],"env_steps":400,"learner_steps":288,"env_steps_per_s":957.5551884832363,"learner'
    '_steps_per_s":689.4397357079301,"actor_env_steps_per_s":{"0":957.5551884832363},"actor_ms_per_step":{"in'
    'ference":0.0180335474669846,"env":0.009376289981446462,"pull":1.9127492123516276e-05,"deserialize":8.535'
    '249435226433e-05,"load":0.014159539996398962},"actor_time_share":{"inference":0.01726811694376983,"env":'
    '0.008978315120457447,"pull":1.8315629325545245e-05,"deserialize":8.172972381699683e-05,"load":0.01355854'
    '0990087731,"other":0.003157109788048008,"rate_limit":0.48076599589833535,"dispatch":0.47617187590615906}'
    ',"actor_busy_ms_per_step":0.04497090999393549,"actor_wall_ms_per_step":0.542249689988239,"evaluator_busy'
    '_s":0.0017021029998431914,"coordinator_ms_per_step":0.2707221074796151,"learner_ms_per_step":1.050860031'
    '2783125,"env_steps_at_target":null,"learner_time_share":{"learning":0.7245046622305469,"waiting":0.27549'
    '53377694531},"learner_busy_s":0.302647689008154,"weight_versions":3,"pulls":2,"loads":2,"restarts":0,"ac'
    'tor_nodes":{"0":["local"]},"episodes":37,"broadcast":{"build_s":0.00030585300191887654,"bytes":4303.0,"v'
    'ersion":3.0},"energy":{"available":true,"energy_kwh":3.2393820340122787e-06,"cpu_energy_kwh":9.009228395'
    '620019e-07,"ram_energy_kwh":2.338459194450277e-06,"co2_kg":1.1968641982526185e-06,"country":"USA","metho'
    'd":"estimated (codecarbon: CPU TDP x load, RAM by size)"},"actor_quant":{"precision":"int8","mode":"int8'
    '-dyn-tensor","fp32_layers":[0]},"provenance":{"versions":{"quarl":"0.2.0","torch":"2.13.0+cpu","onnxrunt'
    'ime":"1.32.0","stable-baselines3":"2.9.2","sb3-contrib":"2.9.2","gymnasium":"1.4.0","numpy":"2.4.6","ray'
    '":"2.60.0"},"python":"3.11.7","cpu":"AMD EPYC","cpu_flags":["avx2","fma","avx512f","avx512bw","avx512_vn'
    'ni","avx512_bf16"],"cores":2,"host":"vm"},"machine_busy_cores":1.9869270161068957,"steady_env_steps_per_'
    's":null,"mismatch":null}'
)
"""``summary.json`` of a 400-step local dqn run (prioritized replay, int8 actors) written by
quarl 4aee83d, before the summary's parts were typed."""


def _read(tmp_path: Path, data: dict) -> ActorQSummary:
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(data))
    return ActorQSummary.read(path)


def test_a_summary_written_before_its_parts_were_typed_reads_back_as_stored(tmp_path: Path) -> None:
    stored = json.loads(STORED)
    summary = _read(tmp_path, stored)
    assert summary.to_json() == stored
    assert summary.provenance == stored["provenance"] and summary.provenance is not None
    assert summary.provenance["versions"]["quarl"] == "0.2.0" and summary.provenance["cores"] == 2
    assert summary.machine == {"cpu": "AMD EPYC", "cores": 2, "gpu": None}
    assert summary.energy.get("available") is True and summary.energy["co2_kg"] == pytest.approx(1.1968641982526185e-06)
    assert summary.actor_quant == {"precision": "int8", "mode": "int8-dyn-tensor", "fp32_layers": [0]}
    assert summary.config["policy_layers"] == [32, 32] and summary.actor_precision == "int8"
    assert ActorQConfig.from_json(summary.config) == ActorQConfig.flat(
        "CartPole-v1", local=True, max_minutes=1.0, out=Path("/tmp/aqrun_old"), actors=1, policy_layers=(32, 32),
        batch_size=32, min_replay=100, eval_episodes=2, max_env_steps=400, checkpoint_replay=True,
        target_reward=1e9, replay="prioritized")


@pytest.mark.parametrize("stored, read", [
    (None, None),  # a summary of a quarl before provenance was recorded: no key at all
    ({}, None),  # one built without it (written as {})
    ({"python": "3.11.7", "cpu": "x"}, None),  # partial
    ({**json.loads(STORED)["provenance"], "cores": "2"}, None),  # a field of another type
    (json.loads(STORED)["provenance"], json.loads(STORED)["provenance"]),
])
def test_a_stored_provenance_is_typed_whole_or_none_and_the_summary_loads(tmp_path: Path, stored: dict | None,
                                                                         read: dict | None) -> None:
    data = actorq_summary(config={"actor_precision": "int8"})
    if stored is not None:
        data["provenance"] = stored
    summary = _read(tmp_path, data)
    assert summary.provenance == read
    assert summary.to_json()["provenance"] == (read or {})  # written as quarl wrote a missing one


def test_provenance_is_the_typed_dict_a_summary_stores() -> None:
    mine = provenance()
    fields = typing.get_type_hints(Provenance, include_extras=True)
    required = {name for name, hint in fields.items() if typing.get_origin(hint) is not typing.NotRequired}
    assert required <= set(mine) <= set(fields)
    assert ("cpu_kind" in mine) == (cpu_kind() != "native")  # recorded where quarl answers as another CPU
    assert whole_provenance(mine) == mine and whole_provenance(json.loads(json.dumps(mine))) == mine


def test_the_parts_of_a_summary_are_kept_as_stored_or_refused_in_one_line(tmp_path: Path) -> None:
    """Another quarl's extra fields in a part are kept; a part's field of the wrong type is
    refused naming it; an old config's infinite budget still reads."""
    data = actorq_summary(config={"actor_precision": "int8", "max_minutes": float("inf")},
                          machine={"cpu": "x", "cores": 4, "gpu": None, "memory_gb": 16},
                          energy={"available": False, "error": "no RAPL", "note": "x"},
                          actor_quant={"precision": "fp16", "wire_bits": 16})
    summary = _read(tmp_path, data)
    assert summary.to_json() == {**data, "provenance": {}, "machine_busy_cores": None, "steady_env_steps_per_s": None,
                                 "mismatch": None}
    for part, value, field in (("machine", {"cores": "4"}, "machine.cores"),
                               ("energy", {"available": "yes"}, "energy.available"),
                               ("actor_quant", {"wire_bits": 16.5}, "actor_quant.wire_bits")):
        with pytest.raises(QuarlError, match=rf"summary.json: field {field}: ") as info:
            _read(tmp_path, {**data, part: value})
        assert "\n" not in str(info.value)


def _config(**fields: object) -> ActorQConfig:
    return ActorQConfig.flat("CartPole-v1", **{"local": True, "actors": 1, "policy_layers": (16,), "batch_size": 8,
                                               **fields})


def test_a_checkpoint_without_a_learner_is_refused_in_one_line(tmp_path: Path) -> None:
    config = _config(out=tmp_path)
    learner, replay = make_learner(config, 4, 2), Replay(100)
    torch.save({"state": {}, "limiter": (0, 0), "replay": None, "config": config.to_json()}, tmp_path / "checkpoint.pt")
    with pytest.raises(QuarlError, match=r"checkpoint.pt holds no learner: it was not written by quarl actorq"):
        restore(tmp_path / "checkpoint.pt", learner, replay, RateLimiter.from_tolerance(1.0, 10, 0.1), config)
