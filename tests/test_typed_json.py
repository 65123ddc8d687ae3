"""The typed images of quarl's dataclasses (``to_json``, TypedDicts) hold what
``dataclasses.asdict`` held, key for key and in its order: stored keys, hashes and files
written before they were typed stay the same (issue 39)."""

from __future__ import annotations

import dataclasses

import pytest

from quarl.quantization.config import QATConfig, QATLayerState, QATState, QuantConfig


@pytest.mark.parametrize("config", [QuantConfig(), QuantConfig.parse("int8", QuantConfig(block_size=64)),
                                    QuantConfig(precision="nbit", bits=3, scheme="affine", activations=True)])
def test_quant_config_json_is_its_fields_in_order(config: QuantConfig) -> None:
    as_json = config.to_json()
    assert list(as_json.items()) == list(dataclasses.asdict(config).items())


def test_qat_json_is_written_as_before() -> None:
    """qat.json's model writes the bytes quarl wrote from its TypedDicts: the settings' fields in
    their order, then whether fake quantization was on, then each layer's state."""
    import json

    config = QATConfig(bits=4, quant_delay=100, scheme="affine", critic=True)
    layer = QATLayerState.model_construct(quantize=True, out_min=float("inf"), out_max=float("-inf"), w_min=-1.0,
                                          w_max=0.5)
    state = QATState.model_construct(config=config, enabled=False, layers={"q_net.q_net.0": layer})
    before = {"config": dataclasses.asdict(config), "enabled": False, "layers": {"q_net.q_net.0": {
        "quantize": True, "out_min": float("inf"), "out_max": float("-inf"), "w_min": -1.0, "w_max": 0.5}}}
    assert json.dumps(state.model_dump(), indent=1) == json.dumps(before, indent=1)


def test_env_json_is_what_json_made_of_its_fields() -> None:
    import json

    from quarl.envs import EnvSpec
    from quarl.evaluation.calibration import CalibrationEpisodes

    spec = EnvSpec("BreakoutNoFrameskip-v4", {"max_episode_steps": 100, "x": [1, 2.5, None]},
                   ("atari", ("frame_skip", {"skip": 2})), 4)
    for dump in (dict(sort_keys=True, default=str), dict(indent=1)):  # the choice cache's key, an export's sidecar
        assert json.dumps(spec.to_json(), **dump) == json.dumps(dataclasses.asdict(spec), **dump)
    key = CalibrationEpisodes(spec, 500).cache_key()
    assert json.dumps(key, sort_keys=True) == json.dumps(
        {"env": dataclasses.asdict(spec), "first_seed": 10_100, "max_steps": 500, "steps": 20_000, "caps": [16, 64]},
        sort_keys=True)


def test_a_quant_summary_is_a_mode_and_fields_of_their_types() -> None:
    from quarl.quant.summary import is_quant_summary

    assert is_quant_summary({"mode": "int8-dyn-tensor", "fp32_layers": [0], "agreement": None, "recovered": True,
                             "a field of a later quarl": [1]})
    assert not is_quant_summary({"fp32_layers": [0]}) and not is_quant_summary(["int8"])
    assert not is_quant_summary({"mode": "int8-dyn-tensor", "agreement": "high"})
