"""Echo cancellation for the microphone demo: what the agent plays is taken back out of what the microphone hears,
before the endpointer, so that its own voice through a speakerphone is never heard as the user's.

The loop knows every sample it plays (its sink gets ``play(t, pcm)`` at clock time ``t`` and ``clear_after(t)`` when
the rest is dropped), so the echo's source is known exactly; only the room (the path from the speaker to the
microphone) and the delay between play and capture are not.  The parts, all at ``ASR_RATE`` (16 kHz):

- ``EchoReference``: the played audio on the clock, kept at the sink's rate as the sink plays it (a piece added at
  ``play``, the rest dropped at ``clear_after``) and read back at 16 kHz for any span (resampled with margins, so a
  span cut anywhere matches the whole signal resampled at once).
- ``DelayEstimator``: the delay between the reference and the microphone by GCC-PHAT (the cross-spectrum whitened,
  averaged over updates; the peak of its inverse transform), every 250 ms while the reference is playing; a new
  estimate is taken once two updates agree.
- ``EchoCanceller``: a partitioned-block frequency-domain adaptive filter (PBFDAF, overlap-save, 10 ms blocks, 200 ms
  of echo path by default) placed at the estimated delay (moving the delay shifts the partitions: what was learned is
  kept), normalized per frequency bin, its step lowered when the error is more than the echo it expects (the user is
  speaking: double talk) and shrunk when it makes the signal louder (divergence); then a residual echo suppressor: a
  gain per bin from the echo power still expected there (the delayed reference's power envelope times the residual
  echo-to-reference ratio learned per band, which starts high, so a filter not yet converged is covered) and never
  below what brings the residual down to the microphone's own noise floor (the endpointer's noise gate then ignores
  it).  The suppressor works on windowed frames (square-root Hann, half overlap), so the output is one block (10 ms)
  behind the input.
- ``EchoTee``: a sink wrapper that plays into the real sink and into the reference; ``EchoCancellingInput``: cleans each
  microphone chunk before ``VoiceLoop.feed`` (the capture time of its first sample mapped to the clock as the loop's
  input buffer does).

Written here in numpy (no binding: webrtc's audio processing and speexdsp are published as sources to compile only).
``bench/echo.py`` measures the echo return loss enhancement; ``voice.speakerphone`` simulates a room around the loop.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from .audio import AudioChunk, Resampler, TeeSink, to_pcm16
from .protocols import ASR_RATE

#: samples per block (10 ms at 16 kHz): a 20 ms microphone chunk is two blocks
BLOCK = ASR_RATE // 100


class EchoReference:
    """The agent's played audio on the clock, at the sink's ``rate``; ``read16`` gives any span of it at 16 kHz."""

    def __init__(self, rate: int, keep_s: float = 4.0):
        self.rate = rate
        frac = Fraction(ASR_RATE, rate)
        self._up, self._down = frac.numerator, frac.denominator
        # margin (in units of ``down`` source samples) around a span read: more than the resampling filter's half-length
        self._margin = -(-32 // self._down)
        self.keep = int(keep_s * rate)
        self._buf = np.zeros(rate * 8, np.float32)
        self._base = 0  # source index of _buf[0]
        self._end = 0  # one past the last source sample held

    # -- as the sink plays --------------------------------------------------------------------------------------------

    def play(self, t: float, pcm: np.ndarray) -> None:
        i = int(round(t * self.rate))
        x = np.asarray(pcm, np.float32).reshape(-1) / 32768.0
        if i < self._base:
            x, i = x[self._base - i:], self._base
        if not len(x):
            return
        self._room(i + len(x))
        a = i - self._base
        self._buf[a:a + len(x)] += x
        self._end = max(self._end, i + len(x))

    def clear_after(self, t: float) -> None:
        i = max(int(round(t * self.rate)), self._base)
        if i < self._end:
            self._buf[i - self._base:self._end - self._base] = 0.0
            self._end = i

    def forget_before(self, k16: int) -> None:
        """The canceller has read up to 16 kHz sample ``k16``: older audio than ``keep_s`` before it may go."""
        i = k16 * self._down // self._up - self.keep
        drop = i - self._base
        if drop <= 0:
            return
        held = max(0, self._end - self._base)
        if drop >= held:
            self._buf[:held] = 0.0
        else:
            self._buf[:held - drop] = self._buf[drop:held]
            self._buf[held - drop:held] = 0.0
        self._base = i
        self._end = max(self._end, i)

    def _room(self, end: int) -> None:
        need = end - self._base
        if need > len(self._buf):
            grown = np.zeros(max(2 * len(self._buf), need), np.float32)
            grown[:len(self._buf)] = self._buf
            self._buf = grown

    @property
    def end_s(self) -> float:
        """Clock time at which the last audio played so far ends."""
        return self._end / self.rate

    # -- read back ----------------------------------------------------------------------------------------------------

    def source(self, a: int, b: int) -> np.ndarray:
        """Source samples [a, b) (zeros where nothing played or it is forgotten)."""
        out = np.zeros(max(0, b - a), np.float32)
        lo, hi = max(a, self._base), min(b, self._end)
        if hi > lo:
            out[lo - a:hi - a] = self._buf[lo - self._base:hi - self._base]
        return out

    def read16(self, k0: int, k1: int) -> np.ndarray:
        """The played audio at 16 kHz for samples [k0, k1) of the clock (sample k at time k / 16000), float32."""
        up, down = self._up, self._down
        if up == down:
            return self.source(k0, k1)
        from scipy.signal import resample_poly

        a, b = (k0 // up) * up, -(-k1 // up) * up
        m = self._margin
        src = self.source(a * down // up - m * down, b * down // up + m * down)
        if not src.any():
            return np.zeros(k1 - k0, np.float32)
        y = resample_poly(src, up, down)
        s = k0 - a + m * up
        return y[s:s + k1 - k0].astype(np.float32)


class DelayEstimator:
    """The delay (in samples) by which the microphone lags the reference: GCC-PHAT over ``window`` samples, lags 0 to
    ``max_delay``, the cross-spectra averaged over updates (``smoothing``)."""

    def __init__(self, max_delay: int = ASR_RATE // 2, window: int = ASR_RATE, smoothing: float = 0.6,
                 min_rms: float = 1e-3, min_peak: float = 8.0):
        self.max_delay, self.window, self.smoothing = max_delay, window, smoothing
        self.min_rms, self.min_peak = min_rms, min_peak
        self.nfft = 1 << int(np.ceil(np.log2(window + 2 * max_delay)))
        self._g: np.ndarray | None = None
        self.last: int | None = None  # the last update's peak (not yet agreed)
        self.peak = 0.0  # its height over the correlation's spread

    def update(self, ref: np.ndarray, mic: np.ndarray) -> int | None:
        """``ref``: the reference's last ``window + max_delay`` samples; ``mic``: the microphone's last ``window``,
        ending at the same clock sample.  Returns the peak's lag, or None (too little reference, no clear peak)."""
        if np.sqrt(np.mean(ref[-self.window:] ** 2)) < self.min_rms:
            return None
        n = self.nfft
        y = np.zeros(len(ref), np.float32)
        y[len(ref) - len(mic):] = mic
        g = np.fft.rfft(y, n) * np.conj(np.fft.rfft(ref, n))
        self._g = g if self._g is None else self.smoothing * self._g + (1 - self.smoothing) * g
        mag = np.abs(self._g)
        r = np.fft.irfft(self._g / (mag + 1e-3 * mag.max() + 1e-20), n)[:self.max_delay + 1]
        lag = int(np.argmax(r))
        spread = float(np.std(r)) + 1e-12
        self.peak = float(r[lag]) / spread
        if self.peak < self.min_peak:
            return None
        return lag


def _bands(bins: int, width: int) -> np.ndarray:
    """Each bin's band (bins pooled ``width`` at a time) for the residual echo estimate."""
    return np.minimum(np.arange(bins) // width, (bins - 1) // width)


class EchoCanceller:
    """Microphone blocks in, echo taken out (see the module's docstring).  ``process(pcm, k0)`` takes 16 kHz samples
    whose first was captured at clock sample ``k0`` and returns as many, one block behind with the suppressor on.

    ``delay_s``: the prior delay between play and capture (a device's reported latencies), used until estimated.
    ``estimate_delay`` False keeps it.  ``suppress`` False: the linear filter alone (no suppressor, no lag)."""

    def __init__(self, reference: EchoReference, *, filter_ms: int = 200, delay_s: float = 0.0, max_delay_s: float = 0.5,
                 estimate_delay: bool = True, suppress: bool = True, mu: float = 0.8, over: float = 8.0):
        B = self.B = BLOCK
        self.ref = reference
        self.P = max(1, filter_ms * ASR_RATE // 1000 // B)
        self.max_blocks = int(max_delay_s * ASR_RATE) // B
        self.ring = self.max_blocks + self.P + 4  # reference spectra kept (by block)
        self.bins = B + 1
        self.mu = mu
        self.suppress = suppress
        self.estimate = DelayEstimator(max_delay=int(max_delay_s * ASR_RATE)) if estimate_delay else None
        self.delay = max(0, int(round(delay_s * ASR_RATE)))  # samples, as estimated (or the prior)
        self.D = self._bulk(self.delay)  # whole blocks the filter's first partition sits behind the microphone
        self.W = np.zeros((self.P, self.bins), np.complex128)  # the adapting (background) filter, by partition
        self.Wf = np.zeros_like(self.W)  # the one whose error is the output (foreground)
        self._Sf = self._Sb = self._Sd = 0.0
        self._better = 0
        self.X = np.zeros((self.ring, self.bins), np.complex128)  # reference 2B-frame spectra, by block (mod ring)
        self._px = np.zeros((self.ring, self.bins))  # their powers
        #: the delay is known (given, or estimated once): until then the suppressor expects echo from the whole range
        self.delay_known = not estimate_delay
        self.Pxx = np.full(self.bins, 1e-6)
        self.j = 0  # blocks done
        self._x_prev = np.zeros(B, np.float32)
        self._cons = 0  # the next partition the gradient constraint applies to
        # the suppressor
        self.win = np.sqrt(0.5 - 0.5 * np.cos(2 * np.pi * np.arange(2 * B) / (2 * B))).astype(np.float64)
        self.band = _bands(self.bins, 8)
        nb = int(self.band.max()) + 1
        self.gamma = np.full(nb, 2.0)  # residual echo power / reference envelope power, per band (starts high)
        self.over = over  # the suppressor's margin over the residual echo it expects (power ratio)
        self.down = 0.05  # how fast the ratio follows lower values (per block)
        self.Se = np.zeros(self.bins)
        self.Sx = np.zeros(self.bins)  # the delayed reference's power envelope
        self.noise = np.full(self.bins, 1e-12)
        self._noise_init = False
        self._e_prev = np.zeros(B)
        self._p_prev = np.zeros(B)
        self._ola = np.zeros(B)
        self._ola_p = np.zeros(B)
        # input carried over (less than a block) and its clock sample
        self._carry = np.zeros(0, np.float32)
        self._carry_p = np.zeros(0, np.float32)
        self._k = None
        self._out = np.zeros(0, np.float32)  # output not handed out yet
        self._out_p = np.zeros(0, np.float32)
        # the delay estimator's history (mic and reference at the same clock samples)
        self._hist_n = (self.estimate.window + self.estimate.max_delay) if self.estimate else 0
        self._mic_hist = np.zeros(self._hist_n, np.float32)
        self._ref_hist = np.zeros(self._hist_n, np.float32)
        self._since = 0
        self.delays: list[tuple[int, int]] = []  # (clock sample, delay taken) each time it changed
        self.dtd = 0.0  # the last block's double-talk measure (error over the echo expected; > 1: the user speaks)
        self.erl = 1.0  # the microphone's power over the reference envelope's while only the agent speaks (``_near``)
        self._hang = 0  # blocks the double talk is held for
        self._xe = self._dd = 0.0
        self.linear: list[np.ndarray] | None = None  # a list here collects each block's error before the suppressor

    def _bulk(self, delay: int) -> int:
        """Whole blocks the first partition starts behind: a block before the direct path (its onset may be early)."""
        return int(np.clip(delay // self.B - 1, 0, self.max_blocks))

    # -- the stream ---------------------------------------------------------------------------------------------------

    def process(self, pcm: np.ndarray, k0: int, probe: np.ndarray | None = None):
        """Clean microphone samples (int16 or float) captured from clock sample ``k0`` on; returns int16 of the same
        length (float in, float out).  ``probe``: another signal of the same length given the same suppressor gains
        (what ``bench/echo.py`` measures the residual echo with during double talk); then returns (out, probe_out)."""
        is_int = pcm.dtype == np.int16
        x = pcm.astype(np.float32) / 32768.0 if is_int else pcm.astype(np.float32)
        if self._k is None:
            self._k = k0
        elif k0 != self._k + len(self._carry):  # a gap (input dropped): start the block grid afresh
            self._carry = self._carry[:0]
            self._carry_p = self._carry_p[:0]
            self._k = k0
        buf = np.concatenate([self._carry, x])
        pbuf = np.concatenate([self._carry_p, probe.astype(np.float32) if probe is not None else np.zeros(len(x), np.float32)])
        n = len(buf) // self.B
        outs, pouts = [self._out], [self._out_p]
        for i in range(n):
            o, po = self._block(buf[i * self.B:(i + 1) * self.B], self._k + i * self.B, pbuf[i * self.B:(i + 1) * self.B])
            outs.append(o)
            pouts.append(po)
        self._carry = buf[n * self.B:]
        self._carry_p = pbuf[n * self.B:]
        self._k += n * self.B
        out = np.concatenate(outs)
        pout = np.concatenate(pouts)
        self._out, self._out_p = out[len(x):], pout[len(x):]
        out, pout = out[:len(x)], pout[:len(x)]
        if len(out) < len(x):  # (not a whole block yet, the first time)
            out = np.concatenate([np.zeros(len(x) - len(out), np.float32), out])
            pout = np.concatenate([np.zeros(len(x) - len(pout), np.float32), pout])
        self.ref.forget_before(self._k - self._hist_n - (self.max_blocks + self.P + 2) * self.B)
        res = to_pcm16(out) if is_int else out
        return res if probe is None else (res, pout)

    def _block(self, d: np.ndarray, k: int, probe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        B, P = self.B, self.P
        x = self.ref.read16(k, k + B)
        self.X[self.j % self.ring] = np.fft.rfft(np.concatenate([self._x_prev, x]))
        self._x_prev = x
        if self.estimate is not None:
            self._track_delay(d, x, k)
        idx = (self.j - self.D - np.arange(P)) % self.ring
        Xs = self.X[idx]
        active = self.j - self.D >= 0 and np.any(Xs[0])
        self._px[self.j % self.ring] = np.abs(self.X[self.j % self.ring]) ** 2 / (2 * B)
        if self.delay_known:
            px = np.max(self._px[idx[:3]], axis=0)
        else:  # the delay is not known yet: the echo may come from anywhere in the range
            px = np.max(self._px[(self.j - np.arange(self.max_blocks + 3)) % self.ring], axis=0)
        # the delayed reference's power envelope (the echo's tail decays after the reference stops)
        self.Sx = np.maximum(px, 0.7 * self.Sx)
        if active:
            # two filters (as speexdsp's MDF does): the background adapts all the time, the foreground (whose error is the
            # output) takes the background's taps only once they take out clearly more: adapting on the user's voice
            # (double talk) makes the background worse, never the output
            e_b = d - np.fft.irfft(np.sum(self.W * Xs, axis=0))[B:]
            e = d - np.fft.irfft(np.sum(self.Wf * Xs, axis=0))[B:]
            self._near(d)
            self._adapt(Xs, e_b)
            self._compare(d, e, e_b)
        else:
            e = d.astype(np.float64)
        if self.linear is not None:
            self.linear.append(e.astype(np.float32))
        self.j += 1
        return self._suppress(e, probe) if self.suppress else (e.astype(np.float32), probe)

    def _near(self, d: np.ndarray) -> None:
        """Double talk, from the microphone against the reference alone (whatever the filters have learned): the
        microphone's power over the delayed reference's envelope is the echo's loss while only the agent speaks; it
        is followed fast downwards and slowly upwards, and a block well above it is the user speaking (held 200 ms)."""
        self._xe = 0.7 * self._xe + 0.3 * float(np.sum(self.Sx)) * (2 * self.B) / self.bins
        self._dd = 0.7 * self._dd + 0.3 * float(d @ d)
        xe, dd = self._xe, self._dd
        if xe < 1e-7:
            return
        r = dd / xe
        rate = 0.02 if r < self.erl else 0.002 if r < 8 * self.erl else 0.0005
        self.erl += rate * (r - self.erl)
        if dd > 8 * self.erl * xe:
            self._hang = 20
        elif self._hang:
            self._hang -= 1

    @property
    def double_talk(self) -> bool:
        return self._hang > 0

    def _adapt(self, Xs: np.ndarray, e: np.ndarray) -> None:
        B, P = self.B, self.P
        E = np.fft.rfft(np.concatenate([np.zeros(B), e]))
        self.Pxx = 0.9 * self.Pxx + 0.1 * (np.abs(Xs[0]) ** 2)
        # double talk: the error's power against the echo the suppressor still expects (its learned ratio)
        ee = float(e @ e)
        expected = float(np.sum(self.gamma[self.band] * self.Sx)) * (2 * B) / self.bins + 1e-10
        self.dtd = ee / (4 * expected)
        step = self.mu / P * min(1.0, 1.0 / max(self.dtd, 1e-9)) * (0.1 if self._hang else 1.0)
        grad = np.conj(Xs) * E / (self.Pxx + 1e-6 + 1e-3 * np.max(self.Pxx))
        self.W += step * grad
        # the gradient constraint (the filter's time-domain taps past B are zero), on two partitions a block
        for _ in range(2):
            p = self._cons
            w = np.fft.irfft(self.W[p])
            w[B:] = 0.0
            self.W[p] = np.fft.rfft(w)
            self._cons = (p + 1) % P

    def _compare(self, d: np.ndarray, e_f: np.ndarray, e_b: np.ndarray) -> None:
        """Copy the background filter into the foreground when it has done clearly better for a while; reset it from
        the foreground when it has gone clearly wrong (adapted on the user's voice)."""
        a = 0.8
        self._Sf = a * self._Sf + (1 - a) * float(e_f @ e_f)
        self._Sb = a * self._Sb + (1 - a) * float(e_b @ e_b)
        self._Sd = a * self._Sd + (1 - a) * float(d @ d)
        if self._Sb < 0.7 * self._Sf and not self._hang:
            self._better += 1
            if self._better >= 3:
                self.Wf = self.W.copy()
                self._Sf = self._Sb
                self._better = 0
        else:
            self._better = 0
        if self._Sb > 4 * self._Sf and self._Sb > self._Sd:
            self.W = self.Wf.copy()
            self._Sb = self._Sf

    def _suppress(self, e: np.ndarray, probe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        B, w = self.B, self.win
        Ew = np.fft.rfft(np.concatenate([self._e_prev, e]) * w)
        self._e_prev = e
        pe = np.abs(Ew) ** 2 / (2 * B)
        self.Se = 0.4 * self.Se + 0.6 * pe
        # the microphone's own noise floor, by minimum statistics (slow to rise)
        if not self._noise_init:
            self.noise, self._noise_init = self.Se + 1e-12, True
        self.noise = np.where(self.Se < self.noise, 0.7 * self.noise + 0.3 * self.Se, self.noise * 1.003)
        # the residual echo-to-reference ratio per band, while the reference plays: it follows the lower values fast,
        # the higher ones slowly (the user's voice raises the error, not the echo)
        nb = len(self.gamma)
        sx = np.bincount(self.band, self.Sx, nb)
        se = np.bincount(self.band, np.maximum(self.Se - self.noise, 0.0), nb)
        on = sx > 1e-9
        q = np.where(on, se / np.maximum(sx, 1e-20), self.gamma)
        rate = np.where(q < self.gamma, self.down, 0.01)
        self.gamma = np.where(on, np.clip(self.gamma + rate * (q - self.gamma), 1e-6, 4.0), self.gamma)
        echo = self.over * self.gamma[self.band] * self.Sx
        g = np.clip(1.0 - echo / (self.Se + 1e-20), 0.0, 1.0)
        g = np.maximum(g, np.sqrt(np.minimum(1.0, self.noise / (self.Se + 1e-20))))
        out = np.fft.irfft(Ew * g) * w
        o = self._ola + out[:B]
        self._ola = out[B:]
        Pw = np.fft.rfft(np.concatenate([self._p_prev, probe]) * w)
        self._p_prev = probe
        pout = np.fft.irfft(Pw * g) * w
        po = self._ola_p + pout[:B]
        self._ola_p = pout[B:]
        return o.astype(np.float32), po.astype(np.float32)

    def _track_delay(self, d: np.ndarray, x: np.ndarray, k: int) -> None:
        B = self.B
        self._mic_hist = np.concatenate([self._mic_hist[B:], d.astype(np.float32)])
        self._ref_hist = np.concatenate([self._ref_hist[B:], x])
        self._since += B
        est = self.estimate
        if self._since < ASR_RATE // 4:
            return
        self._since = 0
        lag = est.update(self._ref_hist, self._mic_hist[-est.window:])
        if lag is None:
            return
        agreed = est.last is not None and abs(lag - est.last) <= ASR_RATE // 1000
        est.last = lag
        if agreed and not self.delay_known:
            self.delay_known = True
            self.gamma[:] = 2.0  # (learned against the whole range's envelope: learned again against the delay's)
        if not agreed or abs(lag - self.delay) <= ASR_RATE // 1000:
            return
        self.delay = lag
        self.delays.append((k, lag))
        D = self._bulk(lag)
        shift = D - self.D
        if shift:  # keep what was learned: partition p now sees the block partition p + shift saw
            self.W, self.Wf = self._shifted(self.W, shift), self._shifted(self.Wf, shift)
            self.D = D

    def _shifted(self, W: np.ndarray, shift: int) -> np.ndarray:
        out = np.zeros_like(W)
        if 0 < shift < self.P:
            out[:self.P - shift] = W[shift:]
        elif -self.P < shift < 0:
            out[-shift:] = W[:self.P + shift]
        return out


class EchoTee(TeeSink):
    """A sink that plays into ``sink`` and into the canceller's ``reference`` (what is played is what is cancelled);
    ``start()``, ``close()`` and the like are the real sink's."""

    def __init__(self, sink, reference: EchoReference):
        super().__init__(sink, reference)


class EchoCancellingInput:
    """The input stage: each microphone chunk cleaned before ``VoiceLoop.feed``.  Its first sample's clock time is
    taken as the loop's input buffer takes it (a live clock: the first chunk's arrival less its length; a virtual
    one: 0), so the clock sample of each input sample is known; input at another rate goes through a resampler."""

    def __init__(self, canceller: EchoCanceller, clock):
        self.canceller = canceller
        self.clock = clock
        self._origin: int | None = None  # clock sample of input sample 0
        self._n = 0  # input samples at 16 kHz so far
        self._resampler: Resampler | None = None

    def __call__(self, chunk: AudioChunk) -> AudioChunk:
        pcm = chunk.pcm
        if chunk.rate != ASR_RATE:
            if self._resampler is None or self._resampler.src != chunk.rate:
                self._resampler = Resampler(chunk.rate, ASR_RATE)
            pcm = self._resampler(pcm)
        if self._origin is None:
            t0 = self.clock.now() - len(chunk.pcm) / chunk.rate if self.clock.realtime else 0.0
            self._origin = int(round(t0 * ASR_RATE))
        out = self.canceller.process(pcm, self._origin + self._n)
        self._n += len(pcm)
        return AudioChunk(out, ASR_RATE, chunk.start)


def echo_canceller(sink, clock, *, delay_s: float = 0.0, **options) -> tuple[EchoTee, EchoCancellingInput]:
    """The two ends wired for ``sink`` (which plays at ``sink.rate``) on ``clock``: the sink to give the loop and the
    input stage to clean each microphone chunk with."""
    reference = EchoReference(sink.rate)
    canceller = EchoCanceller(reference, delay_s=delay_s, **options)
    return EchoTee(sink, reference), EchoCancellingInput(canceller, clock)
