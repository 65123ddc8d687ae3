"""quarl: quantized reinforcement learning (QuaRL / ActorQ on today's stack).

``quarl.load``, ``quarl.quantize``, ``quarl.evaluate`` and ``quarl.recover`` are the Python API
(:mod:`quarl.api`); they are imported on first use, so ``import quarl`` stays light."""

from __future__ import annotations

from typing import Any

__version__ = "0.2.0"
__all__ = ["load", "quantize", "evaluate", "recover", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("load", "quantize", "evaluate", "recover"):
        from quarl import api

        return getattr(api, name)
    raise AttributeError(f"module 'quarl' has no attribute {name!r}")
