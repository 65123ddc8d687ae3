"""The one exception type for mistakes a user can fix (bad input, missing file)."""


class QuarlError(Exception):
    """A user error: the CLI prints its message as one line and exits with status 2."""


class StoppedRun(QuarlError):
    """A long run stopped by what it met (a NaN in training) with its checkpoints kept: the
    CLI adds the command that continues it."""
