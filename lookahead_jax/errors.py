"""Errors that describe bad input. The CLIs print their message on one line and exit 2.

They subclass the builtin exceptions a Python caller expects (`ValueError`,
`FileNotFoundError`), so library users can catch either.
"""


class UserInputError(ValueError):
    """A value the user gave (flag, argument, config field) that cannot be used. `field`
    names the request field it is about where there is one (the engine's checks of a
    request: "prompt", "max_new_tokens", "seed", "stop", "id"), so that a front end can
    name its own (the server's OpenAI `param`)."""

    def __init__(self, message: str = "", field: str | None = None):
        super().__init__(message)
        self.field = field


class MissingFileError(UserInputError, FileNotFoundError):
    """A path the user named does not exist or is not the expected kind of file."""


class CheckpointError(UserInputError):
    """A checkpoint directory that is incomplete, damaged or of an unknown format."""
