"""The voice package's error for an engine that cannot run here (a missing model package, voice or
binary): reported in one line, with what to install."""


class EngineError(RuntimeError):
    """An ASR, TTS or audio engine that cannot be loaded or run on this machine."""
