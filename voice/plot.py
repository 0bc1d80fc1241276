"""A per-turn latency waterfall: one row per turn, one coloured bar per stage, the budget line."""

from __future__ import annotations

SEGMENTS = (("endpoint_ms", "endpoint", "#8da0cb"), ("asr_ms", "asr", "#66c2a5"),
            ("first_phrase_ms", "llm to 1st phrase", "#fc8d62"), ("tts_first_audio_ms", "tts 1st audio", "#e78ac3"),
            ("hold_ms", "hold", "#cccccc"))


def waterfall(reports, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.5 * len(reports) + 1.5))
    budget = reports[0].budget_ms if reports else 500
    labels = []
    for row, r in enumerate(reports):
        lat = r.latency_ms
        left = 0.0
        for key, name, colour in SEGMENTS:
            v = lat.get(key)
            if v is None:
                continue
            ax.barh(row, v, left=left, color=colour, edgecolor="white", label=name if row == 0 else None)
            left += v
        v2v = lat.get("voice_to_voice_ms")
        if v2v is not None:
            ax.text(max(left, v2v) + 5, row, f"{v2v:.0f} ms", va="center", fontsize=8)
        labels.append(f"{r.turn}: {r.transcript[:28]}")
    ax.axvline(budget, color="red", linestyle="--", label=f"budget {budget:.0f} ms")
    ax.set_yticks(range(len(reports)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms after the user's last voiced sample")
    ax.set_title("voice-to-voice latency per turn")
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
