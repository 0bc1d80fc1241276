"""Pictures of the simulator: the pipeline timeline (a Gantt of stages and hops for a few tokens),
tokens/s against the number of units, and a plan's units against the callers they hold."""

from __future__ import annotations

from .clock import Timeline

_COLOURS = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def gantt(ax, tl: Timeline, title: str, max_units: int = 24) -> None:
    """Stages on the y axis (the first ``max_units``), simulated time in microseconds on x;
    one colour per sequence, hops drawn thin between the rows."""
    scale = 1e6
    shown = min(tl.n_stages, max_units)
    for sp in tl.spans:
        if sp.stage >= shown:
            continue
        colour = _COLOURS[sp.sequence % len(_COLOURS)]
        x, w = sp.start * scale, (sp.end - sp.start) * scale
        if sp.what == "stage":
            ax.broken_barh([(x, w)], (sp.stage - 0.4, 0.8), facecolors=colour, edgecolors="white", linewidth=0.3)
            if w > 0.04 * tl.makespan * scale:
                ax.text(x + w / 2, sp.stage, str(sp.token), ha="center", va="center", fontsize=6, color="white")
        else:
            ax.broken_barh([(x, w)], (sp.stage + 0.4, 0.2), facecolors=colour, alpha=0.5)
    ax.set_ylim(shown - 0.5, -0.5)
    ax.set_yticks(range(shown))
    ax.set_yticklabels([f"unit {k}" for k in range(shown)], fontsize=7)
    ax.set_xlabel("simulated time (µs)")
    ax.set_title(title, fontsize=9)


def scaling(ax, points: list[tuple[int, float, float]], title: str) -> None:
    """``points``: (units, per-user tok/s, aggregate tok/s with one sequence per unit)."""
    units = [p[0] for p in points]
    ax.plot(units, [p[1] for p in points], "o-", label="per user (1 sequence)")
    ax.plot(units, [p[2] for p in points], "s--", label="aggregate (one sequence per unit)")
    ax.set_xlabel("units")
    ax.set_ylabel("tokens/s")
    ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)


def sim_figure(tl: Timeline, gantt_title: str, points, scaling_title: str, path) -> None:
    plt = _plt()
    fig, (a, b) = plt.subplots(2, 1, figsize=(10, 8), gridspec_kw={"height_ratios": [3, 2]})
    gantt(a, tl, gantt_title)
    scaling(b, points, scaling_title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plan_figure(curves, title: str, path) -> None:
    """``curves``: (system, [(callers, units or None)]) per system: the smallest deployment's units."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5))
    for j, (name, pts) in enumerate(curves):
        xs = [n for n, u in pts if u is not None]
        ax.plot(xs, [u for _, u in pts if u is not None], "o-", color=_COLOURS[j % len(_COLOURS)], label=name)
    ax.set_xlabel("concurrent voice callers")
    ax.set_ylabel("units (wafers or GPUs) of the smallest deployment")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
