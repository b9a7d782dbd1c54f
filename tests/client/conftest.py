"""The client against a live stack: the API served by uvicorn on its own thread with a control worker and node
agents over the lab fleet (tests/api/served.py, tests/api/stack.py: hosts `slow` 1 GPU never boots, `small` 2,
`big` 4; tenants acme and globex), and the context file `berth up` would write (the CLI tests' terminal), so a
client built with no arguments finds it as the CLI does."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.api.served import Served
from tests.api.stack import api_fleet
from tests.cli.test_cli_api import open_terminal


@dataclass
class Live:
    served: Served
    state_dir: Path

    @property
    def url(self) -> str:
        return self.served.base_url


@pytest.fixture
def live(
    database_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Live]:
    with open_terminal(database_url, temporal_env, tmp_path, api_fleet()) as terminal:
        for name, value in terminal.env.items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        monkeypatch.delenv("BERTH_CONTEXT", raising=False)
        monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # no login of the machine's own user
        yield Live(terminal.served, terminal.state_dir)
