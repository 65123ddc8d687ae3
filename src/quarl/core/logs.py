"""Which agent a log line is about: commands that handle many agents (``demo``, ``study``)
run each agent's work inside :func:`about`, and :class:`AgentFilter` on a handler prefixes
every line logged there with the agent's name, so a warning out of seven agents says
whose it is ("ppo LunarLander-v3: int4: no mode agrees ...")."""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator

AGENT: contextvars.ContextVar[str] = contextvars.ContextVar("quarl_agent", default="")


@contextlib.contextmanager
def about(agent: str) -> Iterator[None]:
    """Lines logged inside are about ``agent``."""
    token = AGENT.set(agent)
    try:
        yield
    finally:
        AGENT.reset(token)


class AgentFilter(logging.Filter):
    """Prefix a record with the agent it is about (once, whatever the handlers)."""

    def filter(self, record: logging.LogRecord) -> bool:
        agent = AGENT.get()
        if agent and not getattr(record, "quarl_agent", None):
            record.msg = f"{agent}: {record.msg}"
            record.quarl_agent = agent
        return True
