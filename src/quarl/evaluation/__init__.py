"""Playing policies and judging what was played, above quant, policies and envs.

- :mod:`~quarl.evaluation.episodes`: the evaluation protocol (seeds, vectorized envs,
  greedy or sampled actions) and :func:`~quarl.evaluation.episodes.evaluate`;
- :mod:`~quarl.evaluation.parallel`: the same episodes over worker processes;
- :mod:`~quarl.evaluation.calibration`: the seeds reserved for calibration and
  distillation, and the one rule for calibrating;
- :mod:`~quarl.evaluation.cells`: one policy at one precision (a cell), its settings,
  key, lock and runner; :mod:`~quarl.evaluation.record`: what a cell measured;
- :mod:`~quarl.evaluation.reports`: the tables; :mod:`~quarl.evaluation.playback`: videos.

Importing the package imports none of them (the CLI's quick answers stay quick)."""
