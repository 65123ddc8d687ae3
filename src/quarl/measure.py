"""Measuring one policy at one precision, shared by ``ptq``, ``sweep``, ``study``, the
QAT study, ``export`` and the Python API: the names of three modules, in one place.

- :mod:`quarl.eval_record`: what an evaluation measured (:class:`EvalRecord`, the SQLite
  columns, :data:`RESULT_FORMAT`), a cell's record (:class:`CellRecord`); no heavy imports;
- :mod:`quarl.calibration`: the seeds reserved for calibration and distillation, the
  calibration states and episodes, and :func:`calibrate_if_needed`, the one rule;
- :mod:`quarl.cells`: :class:`EvalSettings`, cell keys, the output lock and the cell runner.

New code imports from those modules; these names stay for the callers written before them.
"""

from __future__ import annotations

from quarl.calibration import (
    CALIBRATION_EPISODE_STEPS,
    CALIBRATION_SEED_OFFSET,
    CALIBRATION_SEEDS,
    CALIBRATION_SIZE,
    CALIBRATION_STEPS,
    DISTILLATION_SEEDS,
    RESERVED_SEEDS,
    SEQUENTIAL_CAPS,
    Calibration,
    CalibrationEpisodes,
    calibrate_if_needed,
    calibration_inputs,
    calibration_returns,
)
from quarl.cells import (
    LATENCY_BUDGET_S,
    MAX_EPISODE_STEPS,
    Cell,
    ConfigIdentity,
    EvalSettings,
    Progress,
    cell_key,
    config_identity,
    evaluate_cells,
    evaluate_config,
    output_lock,
    run_cells,
)
from quarl.eval_record import RESULT_FORMAT, CellRecord, EvalRecord, json_fields, sql_columns

__all__ = [
    "CALIBRATION_EPISODE_STEPS",
    "CALIBRATION_SEEDS",
    "CALIBRATION_SEED_OFFSET",
    "CALIBRATION_SIZE",
    "CALIBRATION_STEPS",
    "DISTILLATION_SEEDS",
    "LATENCY_BUDGET_S",
    "MAX_EPISODE_STEPS",
    "RESERVED_SEEDS",
    "RESULT_FORMAT",
    "SEQUENTIAL_CAPS",
    "Calibration",
    "CalibrationEpisodes",
    "Cell",
    "CellRecord",
    "ConfigIdentity",
    "EvalRecord",
    "EvalSettings",
    "Progress",
    "calibrate_if_needed",
    "calibration_inputs",
    "calibration_returns",
    "cell_key",
    "config_identity",
    "evaluate_cells",
    "evaluate_config",
    "json_fields",
    "output_lock",
    "run_cells",
    "sql_columns",
]
