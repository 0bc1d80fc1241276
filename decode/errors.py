"""Errors the decode core raises for problems a user can fix (bad file, prompt too long)."""


class DecodeError(Exception):
    """Base class: the message is one line, fit to show a user as it is."""


class ModelFileError(DecodeError):
    """The model file is missing, not a GGUF, truncated, or of an unsupported kind."""


class ContextLengthError(DecodeError):
    """A prompt (with the conversation before it) does not fit the context window."""


class ClosedError(DecodeError, AttributeError):
    """A generator used after ``close()`` (an AttributeError too, so ``getattr(state, name, default)`` still answers)."""
