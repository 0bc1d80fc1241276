"""The voice package's error for an engine that cannot run here (a missing model package, voice or
binary): reported in one line, with what to install."""


class EngineError(RuntimeError):
    """An ASR, TTS or audio engine that cannot be loaded or run on this machine."""


class LLMBackendError(RuntimeError):
    """An OpenAI-compatible LLM backend (``--llm URL``) that cannot be reached or fails mid-answer: the turn ends with
    this message (the session and the process go on)."""
