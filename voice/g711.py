"""G.711 (ITU-T): 8-bit mu-law and A-law companding of 8 kHz telephone speech, to and from PCM16.

What phone lines carry, what Twilio's Media Streams (and Telnyx, Plivo, Vonage, Exotel) send, and the Realtime API's
``audio/pcmu`` and ``audio/pcma`` formats.  Both directions are table lookups built once at import from the standard's
segment rules: decoding is a 256-entry table, encoding a 65,536-entry table indexed by the PCM16 sample's bit pattern,
so a frame of any length is one vectorized ``take``.  PCM16 in, PCM16 out: the 14-bit (mu-law) and 13-bit (A-law)
linear ranges of the standard are the top bits of the 16-bit sample.

Mu-law: the 14-bit sample's magnitude (clipped at 8,158) plus a bias of 33, its segment the position of its leading one
above bit 5, four mantissa bits after it, and the byte sent inverted (silence is 0xFF; 0x7F is "negative zero"); decoded
on the 16-bit scale, where the bias is 0x84 (132).
A-law: the 13-bit magnitude's segment and four mantissa bits, every even bit inverted (XOR 0x55; silence is 0xD5).
"""

from __future__ import annotations

import numpy as np

MULAW_BIAS = 0x84
MULAW_CLIP = 32635
#: the code of digital silence in each law
MULAW_SILENCE = 0xFF
ALAW_SILENCE = 0xD5


def _mulaw_decode_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent = (u >> 4) & 0x07
    magnitude = (((u & 0x0F) << 3) + MULAW_BIAS) << exponent
    return np.where(u & 0x80, MULAW_BIAS - magnitude, magnitude - MULAW_BIAS).astype(np.int16)


def _alaw_decode_table() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    seg = (a >> 4) & 0x07
    mantissa = (a & 0x0F) << 4
    t = np.where(seg == 0, mantissa + 8, (mantissa + 0x108) << np.maximum(seg - 1, 0))
    return np.where(a & 0x80, t, -t).astype(np.int16)


def _segment(magnitude: np.ndarray, first_bit: int) -> np.ndarray:
    """The segment (0..7) of each magnitude: how far its leading one sits above ``first_bit`` (0 at or below it)."""
    seg = np.zeros(magnitude.shape, np.int32)
    for s in range(1, 8):
        seg += magnitude >= (1 << (first_bit + s))
    return seg


def _mulaw_encode_table() -> np.ndarray:
    x = np.arange(65536, dtype=np.int32).astype(np.uint16).view(np.int16).astype(np.int32) >> 2  # every PCM16 value, 14-bit
    mask = np.where(x < 0, 0x7F, 0xFF)
    magnitude = np.minimum(np.abs(x), MULAW_CLIP >> 2) + (MULAW_BIAS >> 2)
    exponent = _segment(magnitude, 5)
    mantissa = (magnitude >> (exponent + 1)) & 0x0F
    return (((exponent << 4) | mantissa) ^ mask).astype(np.uint8)


def _alaw_encode_table() -> np.ndarray:
    x = np.arange(65536, dtype=np.int32).astype(np.uint16).view(np.int16).astype(np.int32) >> 3  # 13-bit
    mask = np.where(x >= 0, 0xD5, 0x55)
    magnitude = np.where(x >= 0, x, -x - 1)
    seg = _segment(magnitude, 4)  # segment 0 and 1 share the step (a 5-bit magnitude spans both)
    mantissa = np.where(seg < 2, magnitude >> 1, magnitude >> seg) & 0x0F
    return (((seg << 4) | mantissa) ^ mask).astype(np.uint8)


_ULAW_DEC = _mulaw_decode_table()
_ALAW_DEC = _alaw_decode_table()
_ULAW_ENC = _mulaw_encode_table()
_ALAW_ENC = _alaw_encode_table()
for _t in (_ULAW_DEC, _ALAW_DEC, _ULAW_ENC, _ALAW_ENC):
    _t.flags.writeable = False


def _pcm_bits(pcm: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(pcm, dtype=np.int16).view(np.uint16)


def mulaw_encode(pcm: np.ndarray) -> bytes:
    """PCM16 samples -> mu-law bytes, one per sample."""
    return _ULAW_ENC.take(_pcm_bits(pcm)).tobytes()


def alaw_encode(pcm: np.ndarray) -> bytes:
    """PCM16 samples -> A-law bytes, one per sample."""
    return _ALAW_ENC.take(_pcm_bits(pcm)).tobytes()


def mulaw_decode(data: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    """mu-law bytes -> PCM16 samples (int16), one per byte."""
    return _ULAW_DEC.take(np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data.astype(np.uint8, copy=False))


def alaw_decode(data: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    """A-law bytes -> PCM16 samples (int16), one per byte."""
    return _ALAW_DEC.take(np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data.astype(np.uint8, copy=False))


#: the Realtime API's names for the two laws (``audio/pcmu``, ``audio/pcma``): encoder and decoder
CODECS = {"audio/pcmu": (mulaw_encode, mulaw_decode), "audio/pcma": (alaw_encode, alaw_decode)}
#: G.711's one sample rate
RATE = 8000


# --------------------------------------------------------------------------- the telephone band, for the ASR


class BandWidener:
    """8 kHz telephone-band PCM16 -> 16 kHz, streaming, with the band above 4 kHz filled by the spectrum's mirror image.

    Whisper (and webrtcvad) hear 16 kHz audio; narrowband speech upsampled cleanly leaves the mel bands above 4 kHz
    empty, which tiny.en has seldom seen: on the sample conversations through 8 kHz mu-law its word error went from
    0.016 to 0.24 in the voice loop (consonants lost: "Who is the owner?" -> "to the owner", which the end-of-turn model
    then judged unfinished).  A 2x interpolator that lets the image through at ``image_gain`` (about -10 dB) instead of
    rejecting it puts the fricatives' energy back where the model expects some: 0.11, and the endpoint p50 back at the
    wideband figure.  One FIR (linear phase, ``taps`` long: a windowed-sinc half-band low-pass plus ``image_gain`` of
    the zero-stuffed input), its state carried across chunks; it delays the audio by ``delay`` 16 kHz samples (2 ms).
    """

    def __init__(self, taps: int = 63, image_gain: float = 0.3):
        n = np.arange(taps) - (taps - 1) / 2
        lowpass = np.sinc(n / 2) / 2 * np.hamming(taps)  # cut at 4 kHz of 16
        lowpass /= lowpass.sum()
        h = (1 - image_gain) * lowpass
        h[(taps - 1) // 2] += image_gain  # the zero-stuffed input itself: base band and image at unit gain
        self.h = 2 * h  # zero stuffing halves the level
        self.delay = (taps - 1) // 2
        self._tail = np.zeros(taps - 1)

    def __call__(self, pcm: np.ndarray) -> np.ndarray:
        if not len(pcm):
            return np.zeros(0, np.int16)
        z = np.zeros(2 * len(pcm))
        z[::2] = pcm
        x = np.concatenate([self._tail, z])
        self._tail = x[len(x) - len(self._tail):]
        y = np.convolve(x, self.h, mode="valid")
        return np.clip(np.rint(y), -32768, 32767).astype(np.int16)
