"""The layout ARCHITECTURE.md describes, held to: the one direction of imports between our packages (every import,
those inside functions too), and a design document that names every package and points nowhere outside the repo."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: package -> the packages of ours it may import (ARCHITECTURE.md, "Packages and the direction of imports")
ALLOWED = {
    "decode": set(),
    "wafer": {"decode"},
    "voice": {"decode"},
    "server": {"decode", "voice", "wafer"},
    "samples": {"voice"},
}


def packages() -> list[str]:
    return sorted(p.parent.name for p in ROOT.glob("*/__init__.py"))


def imported_packages(path: Path) -> set[str]:
    """Our top-level packages ``path`` imports (absolute imports; a relative one stays inside its own package)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found.update(n.split(".")[0] for n in names)
    return found & set(ALLOWED)


def test_every_package_has_a_rule():
    assert packages() == sorted(ALLOWED)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_go_one_way(package):
    wrong = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        bad = imported_packages(path) - ALLOWED[package] - {package}
        if bad:
            wrong[str(path.relative_to(ROOT))] = sorted(bad)
    assert not wrong, f"{package} may import only {sorted(ALLOWED[package]) or 'nothing of ours'}; these do not: {wrong}"


def test_the_checker_sees_lazy_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import os\nfrom . import x\n\ndef f():\n    from server.app import VoiceServer\n    import wafer.staged\n")
    assert imported_packages(f) == {"server", "wafer"}


def test_the_design_document_names_every_package_and_stays_inside_the_repo():
    doc = (ROOT / "ARCHITECTURE.md").read_text()
    readme = (ROOT / "README.md").read_text()
    missing = [p for p in packages() if f"`{p}/`" not in doc]
    assert not missing, f"ARCHITECTURE.md does not name {missing}"
    assert "ARCHITECTURE.md" in readme
    for name, text in (("README.md", readme), ("ARCHITECTURE.md", doc)):
        assert "shared/" not in text and "DESIGN.md" not in text, f"{name} points outside the repository"
