"""A per-turn latency waterfall: for each turn, on a time axis starting at the user's last
voiced sample, the endpoint wait (upper lane) and the answer's chain (lower lane: until
the transcript, LLM to the first phrase, TTS to the first audio, hold), and the budget line."""

from __future__ import annotations

CHAIN = (("last_voiced", "transcript", "until transcript (pause + ASR)", "#66c2a5"),
         ("transcript", "first_phrase", "LLM to 1st phrase", "#fc8d62"),
         ("first_phrase", "tts_first_audio", "TTS to 1st audio", "#e78ac3"),
         ("tts_first_audio", "answer_audio", "hold (endpoint / output)", "#cccccc"))


def waterfall(reports, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.6 * len(reports) + 2))
    budget = reports[0].budget_ms if reports else 500
    labels = []
    seen = set()
    for row, r in enumerate(reports):
        s = r.stamps
        lv = s.get("last_voiced")
        if lv is None:
            labels.append(f"{r.turn}: (no endpoint)")
            continue

        def ms(name, lv=lv, s=s):
            return (s[name] - lv) * 1000

        if "endpoint" in s:
            name = "endpoint wait"
            ax.barh(row - 0.2, ms("endpoint"), height=0.35, color="#8da0cb", label=None if name in seen else name)
            seen.add(name)
        for a, b, name, colour in CHAIN:
            if a in s and b in s:
                start = max(0.0, ms(a)) if a != "last_voiced" else 0.0
                ax.barh(row + 0.2, ms(b) - start, left=start, height=0.35, color=colour,
                        label=None if name in seen else name)
                seen.add(name)
        v2v = r.voice_to_voice_ms
        if v2v is not None:
            ax.text(v2v + 5, row + 0.2, f"{v2v:.0f} ms", va="center", fontsize=8)
        labels.append(f"{r.turn}: {r.transcript[:28]}")
    ax.axvline(budget, color="red", linestyle="--", label=f"budget {budget:.0f} ms")
    ax.set_yticks(range(len(reports)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms after the user's last voiced sample")
    ax.set_title("voice-to-voice latency per turn")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3, fontsize=7, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
