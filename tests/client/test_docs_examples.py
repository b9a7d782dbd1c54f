"""docs/client.md's examples: the notebook's runs as written against the live stack, with only the context file
`berth up` would write to find it; the launcher's and the CI job's (which call the reader's own training and test
functions) must at least compile, and name only what the library has."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import berth
from tests.client.conftest import Live

DOC = Path(__file__).parents[2] / "docs" / "client.md"


def blocks() -> dict[str, str]:
    """Each section's first Python block, by its heading."""
    found: dict[str, str] = {}
    for section in re.split(r"^## ", DOC.read_text(), flags=re.M)[1:]:
        heading, _, body = section.partition("\n")
        code = re.search(r"```python\n(.*?)```", body, flags=re.S)
        if code:
            found[heading.strip()] = code.group(1)
    return found


def test_the_notebook_example_runs(live: Live, capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(blocks()["A notebook"], str(DOC), "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("token:")  # the acme token of the context file
    assert any("lab-1/slices" in line for line in printed)
    assert re.search(r" is active on small at \S+", "\n".join(printed))
    assert printed[-1] == "released"


@pytest.mark.parametrize("heading", ["A training launcher", "A CI job"])
def test_the_other_examples_use_only_what_the_library_has(heading: str) -> None:
    tree = ast.parse(blocks()[heading])
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    named = {a for a in used if isinstance(getattr(berth, a, None), type) or callable(getattr(berth, a, None))}
    assert {"allocate"} & named or {"Client"} & named
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "berth":
            assert hasattr(berth, node.attr), f"docs/client.md uses berth.{node.attr}, which does not exist"
