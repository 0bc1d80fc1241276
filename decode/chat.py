"""Chat prompts from the model's own ``tokenizer.chat_template`` (jinja2, sandboxed)."""

from __future__ import annotations

from .errors import ModelFileError

#: Used only when a file carries no template (ChatML, which SmolLM2 and many others use).
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class ChatTemplate:
    """Renders a list of ``{"role", "content"}`` messages into prompt text."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        try:
            self._template = env.from_string(source)
        except TemplateError as exc:
            raise ModelFileError(f"chat template does not parse: {exc}") from None
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token

    @classmethod
    def from_gguf(cls, f, tokenizer) -> ChatTemplate:
        source = f.metadata.get("tokenizer.chat_template", CHATML)

        def text(i):
            return tokenizer.tokens[i] if i is not None and 0 <= i < tokenizer.vocab_size else ""

        return cls(source, bos_token=text(tokenizer.bos_id), eos_token=text(tokenizer.eos_id))

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        for m in messages:
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ValueError(f"a chat message needs 'role' and 'content': {m!r}")
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     bos_token=self.bos_token, eos_token=self.eos_token)
