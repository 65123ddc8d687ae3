"""Third-party warnings known to be harmless, filtered in one place (``quarl -v`` shows
them). Each entry says why it is harmless here.

- MuJoCo's "compiler attribute 'settotalmass' is deprecated" (printed by the C library for
  every HalfCheetah / Hopper / Walker2d model gymnasium's ``-v4`` XML files build): the
  models are gymnasium's, unchanged, and the attribute still works in mujoco 3.x;
- gymnasium's "The environment X-v4 is out of date": RL Zoo agents were trained on v3 / v4,
  and evaluating them on v5 would change the task they were trained for;
- SB3's "You are probably loading a model saved with..." and similar version notes are not
  filtered (they can matter).
"""

from __future__ import annotations

import logging
import warnings

log = logging.getLogger(__name__)

MUJOCO_HARMLESS = ("compiler attribute 'settotalmass' is deprecated",)
WARNINGS_HARMLESS = (r".*is out of date\. You should consider upgrading to version",)


def _mujoco_warning(message: str) -> None:
    if not any(known in message for known in MUJOCO_HARMLESS):
        log.warning("MuJoCo: %s", message.strip())


def filter_warnings() -> None:
    """The warnings above, filtered for this process (once gymnasium is imported: its import
    puts its own filters first, ours must come after)."""
    import gymnasium  # noqa: F401

    for pattern in WARNINGS_HARMLESS:
        warnings.filterwarnings("ignore", message=pattern)


def route_mujoco() -> None:
    """MuJoCo's warnings to the log, its harmless ones dropped."""
    try:
        import mujoco
    except ImportError:  # pragma: no cover - mujoco is a dependency
        return
    mujoco.set_mju_user_warning(_mujoco_warning)


def install() -> None:
    """Filter the warnings above for this process (other MuJoCo warnings go to the log); the
    CLI does each when its library loads (:func:`quarl.cli.common.setup`)."""
    filter_warnings()
    route_mujoco()
