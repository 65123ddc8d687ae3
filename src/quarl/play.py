"""Moved to :mod:`quarl.playback` (``quarl.play`` is the API function); kept while the CLI imports it."""

from quarl.playback import Playback, play, render_kwargs  # noqa: F401
