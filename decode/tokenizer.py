"""Tokenizer built from a GGUF file's own vocabulary and merges (GPT-2 byte-level BPE).

The ``tokenizers`` library runs the BPE; this module reproduces llama.cpp's choices
around it: the pre-tokenizer regexes named by ``tokenizer.ggml.pre``, control and
user-defined tokens matched where they are written in the text (llama.cpp's
``tokenize(special=True)``), no BOS when ``add_bos_token`` is false, and
incremental detokenization to whole UTF-8 characters.
"""

from __future__ import annotations

from functools import lru_cache

from .errors import ModelFileError

# Token types in tokenizer.ggml.token_type (llama.cpp's llama_token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: llama.cpp's pre-tokenizer regexes, applied in order, for the ``tokenizer.ggml.pre`` names we know.
PRE_TOKENIZERS = {
    "default": [_GPT2],
    "gpt2": [_GPT2],
    "smollm": [r"\p{N}", _GPT2],
    "llama3": [_LLAMA3],
    "llama-bpe": [_LLAMA3],
}


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, reversed (char -> byte)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


class Tokenizer:
    """Text <-> token ids for one model."""

    def __init__(self, tokens: list[str], token_types: list[int], merges: list[str], pre: str,
                 bos_id: int | None, eos_id: int | None, add_bos: bool, eot_ids: tuple[int, ...] = ()):
        from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        if pre not in PRE_TOKENIZERS:
            raise ModelFileError(f"unsupported pre-tokenizer {pre!r} (supported: {', '.join(PRE_TOKENIZERS)})")
        self.tokens = tokens
        self.token_types = token_types
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.add_bos = add_bos
        self.vocab_size = len(tokens)
        vocab = {tok: i for i, tok in enumerate(tokens)}
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        bpe = models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, ignore_merges=False)
        tk = HFTokenizer(bpe)
        splits = [pre_tokenizers.Split(Regex(rx), behavior="isolated") for rx in PRE_TOKENIZERS[pre]]
        tk.pre_tokenizer = pre_tokenizers.Sequence(splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tk.decoder = decoders.ByteLevel()
        special = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, token_types) if ty == CONTROL]
        user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, token_types) if ty == USER_DEFINED]
        tk.add_special_tokens(special)
        tk.add_tokens(user)
        self._tk = tk
        self.control_ids = frozenset(i for i, ty in enumerate(token_types) if ty == CONTROL)
        self.stop_ids = frozenset(i for i in (eos_id, *eot_ids) if i is not None)
        bd = byte_decoder()
        self._bytes: list[bytes] = []
        for i, tok in enumerate(tokens):
            if token_types[i] in (CONTROL, USER_DEFINED):
                self._bytes.append(tok.encode("utf-8"))
            else:
                try:
                    self._bytes.append(bytes(bd[c] for c in tok))
                except KeyError:  # a token outside the byte alphabet: keep its text
                    self._bytes.append(tok.encode("utf-8"))

    @classmethod
    def from_gguf(cls, f) -> Tokenizer:
        """Build from an opened ``GGUFFile``."""
        fields = f.metadata

        def get(key, default=None):
            return fields.get(key, default)

        model = get("tokenizer.ggml.model")
        if model != "gpt2":
            raise ModelFileError(f"unsupported tokenizer model {model!r} in {f.path.name} (supported: gpt2 byte-level BPE)")
        tokens = get("tokenizer.ggml.tokens")
        merges = get("tokenizer.ggml.merges", [])
        if not tokens:
            raise ModelFileError(f"{f.path.name} lacks tokenizer.ggml.tokens")
        types = get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
        eos = get("tokenizer.ggml.eos_token_id")
        eot = get("tokenizer.ggml.eot_token_id")
        eot_ids = tuple(i for i in (eot,) if i is not None)
        if "<|im_end|>" in tokens:
            eot_ids += (tokens.index("<|im_end|>"),)
        return cls(
            tokens=tokens, token_types=types, merges=merges, pre=get("tokenizer.ggml.pre", "default"),
            bos_id=get("tokenizer.ggml.bos_token_id"), eos_id=eos,
            add_bos=bool(get("tokenizer.ggml.add_bos_token", False)), eot_ids=eot_ids,
        )

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of ``text``; control tokens written in it map to their ids."""
        ids = self._tk.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return ids

    def token_bytes(self, token_id: int) -> bytes:
        return self._bytes[token_id]

    def decode(self, ids, skip_control: bool = True) -> str:
        data = b"".join(self._bytes[i] for i in ids if not (skip_control and i in self.control_ids))
        return data.decode("utf-8", errors="replace")

    def stream_decoder(self) -> StreamDecoder:
        return StreamDecoder(self)


class StreamDecoder:
    """Turns tokens into text pieces as they come, holding back a split UTF-8 character."""

    def __init__(self, tok: Tokenizer):
        self._tok = tok
        self._pending = b""

    def feed(self, token_id: int) -> str:
        if token_id in self._tok.control_ids:
            return ""
        data = self._pending + self._tok.token_bytes(token_id)
        cut = len(data)
        # keep an incomplete trailing UTF-8 sequence for the next token
        for back in range(1, min(4, len(data)) + 1):
            b = data[-back]
            if b & 0xC0 == 0x80:
                continue
            need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
            if need > back:
                cut = len(data) - back
            break
        self._pending = data[cut:]
        return data[:cut].decode("utf-8", errors="replace")

    def flush(self) -> str:
        out, self._pending = self._pending.decode("utf-8", errors="replace"), b""
        return out
