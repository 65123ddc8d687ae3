"""The typed images of quarl's dataclasses (``to_json``, TypedDicts) hold what
``dataclasses.asdict`` held, key for key and in its order: stored keys, hashes and files
written before they were typed stay the same (issue 39)."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from quarl.quant.config import QATConfig, QATConfigJson, QuantConfig, QuantConfigJson


@pytest.mark.parametrize("config", [QuantConfig(), QuantConfig.parse("int8", block_size=64),
                                    QuantConfig(precision="nbit", bits=3, scheme="affine", activations=True)])
def test_quant_config_json_is_its_fields_in_order(config: QuantConfig) -> None:
    as_json = config.to_json()
    assert list(as_json.items()) == list(dataclasses.asdict(config).items())
    assert list(typing.get_type_hints(QuantConfigJson)) == [f.name for f in dataclasses.fields(QuantConfig)]


def test_qat_config_json_is_its_fields_in_order() -> None:
    config = QATConfig(bits=4, quant_delay=100, scheme="affine", critic=True)
    assert list(config.to_json().items()) == list(dataclasses.asdict(config).items())
    assert list(typing.get_type_hints(QATConfigJson)) == [f.name for f in dataclasses.fields(QATConfig)]
