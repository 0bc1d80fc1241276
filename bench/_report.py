"""What a benchmark writes besides what it prints."""

from __future__ import annotations

import json
from pathlib import Path


def write_json(path: str | None, figures) -> None:
    """The figures as JSON in ``path`` (a ``--json FILE`` option), if one was given."""
    if path:
        Path(path).write_text(json.dumps(figures, indent=1))
