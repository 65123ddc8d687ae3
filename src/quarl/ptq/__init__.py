"""Post-training quantization of one policy: ``ptq`` (:mod:`quarl.ptq.run`: precisions side by
side, played until the verdicts decide), ``sweep`` and ``analyze`` (:mod:`quarl.ptq.sweep`).

Each evaluated cell is appended to ``OUT/results.jsonl`` as soon as it finishes and is
reused when the same command runs again, so an interrupted run resumes; the tables and
plots are rebuilt from those records. How a cell is measured, calibrated and keyed is
:mod:`quarl.evaluation.cells`. One run at a time writes to an output folder (a lock).
"""
