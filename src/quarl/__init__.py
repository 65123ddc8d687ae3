"""quarl: quantized reinforcement learning (QuaRL / ActorQ on today's stack).

``quarl.load``, ``quarl.quantize``, ``quarl.evaluate``, ``quarl.play`` and ``quarl.recover`` are the Python API
(:mod:`quarl.api`), ``quarl.judge`` the verdict for any two policies' paired returns
(:mod:`quarl.evaluation.pairs`); they are imported on first use, so ``import quarl`` stays light."""

from __future__ import annotations

import os
from typing import Any

if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
    # MuJoCo renders (play --video) off screen on a headless machine, for the API as for the CLI;
    # set before anything imports mujoco, and never over a user's own choice
    os.environ.setdefault("MUJOCO_GL", "egl")

__version__ = "0.2.0"
__all__ = ["load", "quantize", "evaluate", "play", "recover", "judge", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("load", "quantize", "evaluate", "play", "recover"):
        from quarl import api

        return getattr(api, name)
    if name == "judge":
        from quarl.evaluation.pairs import judge

        return judge
    raise AttributeError(f"module 'quarl' has no attribute {name!r}")
