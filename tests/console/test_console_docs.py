"""docs/operating.md's Console section shows each page of the console: every picture it names is in the tree (the
browser tests take them with BERTH_SCREENSHOTS=1), and every picture there is named, so none goes stale unseen."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PICTURES = REPO / "docs" / "images" / "console"


def test_every_console_picture_the_operating_guide_names_exists_and_each_is_named() -> None:
    named = set(re.findall(r"\]\((images/console/[^)]+\.png)\)", (REPO / "docs" / "operating.md").read_text()))
    assert named, "docs/operating.md shows no picture of the console"
    missing = [name for name in sorted(named) if not (REPO / "docs" / name).is_file()]
    assert missing == [], f"named in docs/operating.md but not in the tree: {missing}"
    unnamed = sorted(f"images/console/{p.name}" for p in PICTURES.glob("*.png"))
    assert [p for p in unnamed if p not in named] == [], "pictures docs/operating.md does not show"
