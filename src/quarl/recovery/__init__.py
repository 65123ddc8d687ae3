"""Recovering what post-training quantization loses: quantization-aware distillation of a
trained policy onto the grid of the real kernel it will run on.

The fp32 policy is the *teacher*; the *student* is a copy whose forward computes what one
real int mode computes (:mod:`quarl.quant.student`: the mode the automatic choice picks for
the policy, its fp32 layers, block size, activation rounding), trained with a
straight-through gradient. The loop, DAgger (Ross, Gordon and Bagnell, 2011)::

    round 0:   the teacher plays episodes on distillation seeds; its states are kept
    round r:   the student (its real kernel) plays; its states are added (aggregated)
    each round: every state labelled by the teacher's network, ``updates`` Adam steps on
               minibatches of all states, then the real model built from the student's
               integers is checked on held-out states (their own seeds): stop when it
               agrees with the teacher at least as often as the teacher's own fp16 copy
               does (or ``target_agreement``) and keeps the teacher's return on
               calibration episodes (the automatic choice's sequential test); else go on,
               up to ``rounds``. The best round (held-out agreement) is what is written.

Before any round, PTQ's own model that already keeps the original fp32's return on
recovery's test episodes is written as it is. A DQN / QR-DQN at int4 that the rounds on its
own kernel do not repair is distilled again onto other kernels (:func:`~quarl.recovery.workflow.repairs`:
the mixed int4/int8 mode ``int4-block-head8``, blocks of 16, both), each judged against PTQ's
own model by the same paired test (:class:`~quarl.recovery.judge.Judge`).

Seeds: distillation episodes reset with :data:`quarl.evaluation.calibration.DISTILLATION_SEEDS`, which no
evaluation may use (:class:`quarl.evaluation.cells.EvalSettings` refuses them); VecNormalize
statistics are the teacher's, frozen. The loss depends on the action head
(:func:`distill_loss`). A run writes its state after every round and resumes from it.

The output is an RL Zoo run folder (:func:`write_recovered`) whose zip holds the student's
weights on the grid, with the real-kernel export beside it and the original policy
recorded by content hash; ``quarl ptq`` on it plays the ORIGINAL fp32 policy as its fp32
row and the recovered real kernel at its precision.

The package, one module per step: :mod:`~quarl.recovery.config` (what is asked, the seeds
and files), :mod:`~quarl.recovery.losses` (the loss per action head),
:mod:`~quarl.recovery.dagger` (the DAgger rounds, resumable), :mod:`~quarl.recovery.folder`
(writing and reading the recovered folder), :mod:`~quarl.recovery.judge` (what is written,
and when recovery stops), :mod:`~quarl.recovery.report` (what recovery.json and the state
hold, typed) and :mod:`~quarl.recovery.workflow` (``quarl recover``).
"""

from __future__ import annotations

from quarl.recovery.config import (
    EXPORT_DIR,
    MIN_HELDOUT,
    ORIGINAL_ZIP,
    Q_ALGOS,
    RECOVERY_FILE,
    RECOVERY_FORMAT,
    STATE_FILE,
    TEST_SEEDS,
    TRAIN_SEEDS_END,
    RecoverConfig,
)
from quarl.recovery.dagger import RecoveryResult, distill, pick_spec, read_state
from quarl.recovery.folder import (
    Recovered,
    find_recovery,
    load_recovered,
    read_recovery_record,
    sha256_file,
    write_recovered,
)
from quarl.recovery.judge import Judge, shipped_line
from quarl.recovery.losses import distill_loss
from quarl.recovery.report import RoundStats
from quarl.recovery.workflow import (
    RECOVERED_PREFIX,
    finetune_stage,
    finished_record,
    preflight,
    recover_stages,
    recovered_kernel,
    recovered_precision,
    run_recover,
)

__all__ = [
    "RecoverConfig", "Q_ALGOS", "RECOVERY_FILE", "ORIGINAL_ZIP", "EXPORT_DIR", "STATE_FILE", "RECOVERY_FORMAT",
    "MIN_HELDOUT", "TRAIN_SEEDS_END", "TEST_SEEDS", "distill_loss", "RoundStats", "RecoveryResult", "pick_spec",
    "distill", "read_state", "write_recovered", "Recovered", "find_recovery", "load_recovered",
    "read_recovery_record", "sha256_file", "Judge", "shipped_line", "run_recover", "preflight", "finished_record",
    "RECOVERED_PREFIX", "recovered_precision", "recovered_kernel", "recover_stages", "finetune_stage"
]
