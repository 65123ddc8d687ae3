"""quarl: quantized reinforcement learning (QuaRL / ActorQ on today's stack)."""

__version__ = "0.1.0"
