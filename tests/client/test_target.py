"""Which API and token a client uses, resolved as the CLI resolves them (berth/target.py): explicit, then
BERTH_API_URL / BERTH_TOKEN, then `berth login`'s kept login, then the context file, whose token goes to its own
API only."""

from __future__ import annotations

from pathlib import Path

import pytest

import berth
from config.context import StackContext, write_context
from config.settings import Settings


@pytest.fixture
def context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("BERTH_API_URL", "BERTH_TOKEN", "BERTH_CONTEXT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    settings = Settings(state_dir=tmp_path / "state")
    stack = StackContext(
        api_url="http://stack:8000/",
        temporal_address="t:7233",
        database_url="postgresql://x",
        admin_token="admin-token",
        tenant_tokens={"acme": "acme-token"},
    )
    write_context(settings, stack)
    monkeypatch.setenv("BERTH_STATE_DIR", str(settings.state_dir))
    return settings.state_dir


def test_the_context_file_then_the_environment_then_explicit_values(
    context: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert berth.resolve_target(environment=True) == berth.Target("http://stack:8000", "admin-token")
    assert berth.resolve_target(tenant="acme", environment=True).token == "acme-token"
    monkeypatch.setenv("BERTH_TOKEN", "env-token")
    assert berth.resolve_target(environment=True).token == "env-token"
    monkeypatch.setenv("BERTH_API_URL", "http://elsewhere")
    assert berth.resolve_target(environment=True) == berth.Target("http://elsewhere", "env-token")
    assert berth.resolve_target("http://mine", "mine", environment=True) == berth.Target("http://mine", "mine")
    assert "token" not in repr(berth.resolve_target(environment=True))


def test_a_context_token_never_goes_to_another_api(context: Path) -> None:
    with pytest.raises(berth.NotConfigured) as refused:
        berth.Client("http://elsewhere")
    assert "no API token" in refused.value.message
    with pytest.raises(berth.NotConfigured) as unknown:
        berth.resolve_target(tenant="initech")
    assert "no token for tenant 'initech'" in unknown.value.message


def test_nothing_configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("BERTH_API_URL", "BERTH_TOKEN", "BERTH_CONTEXT", "BERTH_STATE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(berth.NotConfigured) as nothing:
        berth.AsyncClient()
    assert nothing.value.code == "not_configured" and "no Berth API configured" in nothing.value.message
