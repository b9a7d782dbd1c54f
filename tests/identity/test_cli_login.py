"""`berth login`, `whoami`, `logout` as a person runs them: the real `berth` processes against the API served over
HTTP, the real OIDC provider process, and the person's browser played by the test (it opens the URL `berth login`
prints, authorizes, and follows the redirect back to the CLI's loopback listener)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from tests.api.served import Served, served_api
from tests.api.stack import api_fleet
from tests.identity.provider import CLIENT_ID, CLIENT_SECRET, Provider

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def api(
    database_url: str, temporal_env: WorkflowEnvironment, oidc_provider: Provider, tmp_path: Path
) -> Iterator[Served]:
    client = temporal_env.client
    with served_api(
        database_url,
        client.service_client.config.target_host,
        client.namespace,
        api_fleet(),
        tmp_path / "lab",
        oidc_issuer_url=oidc_provider.issuer,
        oidc_client_id=CLIENT_ID,
        oidc_roles={"acme-ml": ["member:acme"], "platform": ["admin"]},
    ) as served:
        deadline = time.monotonic() + 10
        while httpx.get(f"{served.base_url}/healthz").json()["control_workers"] == 0:
            assert time.monotonic() < deadline, "the control worker never polled"
            time.sleep(0.05)
        yield served


def _env(home: Path) -> dict[str, str]:
    """A person's shell: their own config directory, no token, no dev-stack context."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
    return env | {
        "XDG_CONFIG_HOME": str(home / "config"),
        "BERTH_STATE_DIR": str(home / "state"),
        "PYTHONPATH": str(REPO),
        "BERTH_OIDC_CLIENT_SECRET": CLIENT_SECRET,
    }


def berth(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args], env=env, capture_output=True, text=True, timeout=120
    )


def _log_in(env: dict[str, str], api: Served, provider: Provider, person: str, *groups: str) -> None:
    """`berth login` as a person runs it: the authorize URL on stderr, the person consents in the browser, whose
    redirect reaches the command's loopback listener."""
    provider.put_user(person, email=person, groups=list(groups))
    login = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "login", "--api", api.base_url, "--no-browser"],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert login.stderr is not None
        line = login.stderr.readline()
        assert line.startswith("Log in at: "), line
        authorize = line.removeprefix("Log in at: ").strip()
        assert "code_challenge_method=S256" in authorize and "redirect_uri=http%3A%2F%2F127.0.0.1%3A" in authorize
        back = provider.consent(authorize, person)  # the person authorizes in the browser
        assert httpx.get(back).text.startswith("Berth: you are logged in")  # the browser follows the redirect
        out, err = login.communicate(timeout=60)
    finally:
        if login.poll() is None:
            login.kill()
            login.wait()
    assert login.returncode == 0, err
    assert f"Logged in to {api.base_url} as {person}" in out


def test_login_whoami_act_and_logout(api: Served, oidc_provider: Provider, tmp_path: Path) -> None:
    env = _env(tmp_path)
    assert "no API token" in berth(env, "whoami", "--api", api.base_url).stderr  # nobody yet

    _log_in(env, api, oidc_provider, "alice@example.com", "acme-ml")
    kept = tmp_path / "config" / "berth" / "credentials.json"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert set(json.loads(kept.read_text())) == {api.base_url}

    me = berth(env, "whoami", "--api", api.base_url)
    assert me.returncode == 0, me.stderr
    assert "alice@example.com" in me.stdout and "member" in me.stdout and "acme" in me.stdout
    created = berth(env, "alloc", "create", "--api", api.base_url, "--gpus", "1", "-o", "json")
    assert created.returncode == 0, created.stderr
    allocation = json.loads(created.stdout)["id"]
    shown = berth(env, "alloc", "get", allocation, "--api", api.base_url)
    assert "Asked by" in shown.stdout and "alice@example.com" in shown.stdout

    # The ID token about to expire: the next command refreshes it with the refresh token, unasked.
    stored = json.loads(kept.read_text())
    stored[api.base_url]["expires_at"] = time.time()
    old = stored[api.base_url]["id_token"]
    kept.write_text(json.dumps(stored))
    assert berth(env, "whoami", "--api", api.base_url).returncode == 0
    assert json.loads(kept.read_text())[api.base_url]["id_token"] != old

    out = berth(env, "logout", "--api", api.base_url)
    assert f"Logged out of {api.base_url}." in out.stdout
    assert json.loads(kept.read_text()) == {}
    assert "no API token" in berth(env, "whoami", "--api", api.base_url).stderr


def test_login_to_an_api_without_a_provider_says_to_use_a_token(stack_without_provider: Served, tmp_path: Path) -> None:
    answer = berth(_env(tmp_path), "login", "--api", stack_without_provider.base_url, "--no-browser")
    assert answer.returncode == 1 and "Traceback" not in answer.stderr
    assert "has no OIDC login configured: use a token" in answer.stderr
    unreachable = berth(_env(tmp_path), "login", "--api", "http://127.0.0.1:9", "--no-browser")
    assert unreachable.returncode == 1 and "cannot ask http://127.0.0.1:9 how to log in" in unreachable.stderr


@pytest.fixture
def stack_without_provider(database_url: str, temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[Served]:
    client = temporal_env.client
    with served_api(
        database_url, client.service_client.config.target_host, client.namespace, api_fleet(), tmp_path / "lab"
    ) as served:
        yield served


def test_a_persons_fleet_apply_and_token_are_in_the_request_log_under_their_name(
    api: Served, oidc_provider: Provider, tmp_path: Path
) -> None:
    """`berth apply` and `berth tokens` go through the API as whoever runs them: a platform admin who logged in is
    the actor the request log names, as for anything else they change."""
    env = _env(tmp_path)
    _log_in(env, api, oidc_provider, "pat@example.com", "platform")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        api_fleet()
        + "---\napiVersion: berth.dev/v1alpha1\nkind: Tenant\nmetadata: {name: initech}\nspec: {gpuQuota: 2}\n"
    )
    applied = berth(env, "apply", "-f", str(fleet), "--api", api.base_url)
    assert applied.returncode == 0, applied.stderr
    assert "created Tenant/initech" in applied.stdout and "new API token for tenant initech" in applied.stdout
    issued = berth(env, "tokens", "create", "--tenant", "initech", "--label", "ci", "--api", api.base_url)
    assert issued.returncode == 0 and issued.stdout.startswith("Token for a member of tenant initech"), issued.stderr

    headers = {"Authorization": f"Bearer {api.admin_token}"}
    log = httpx.get(f"{api.base_url}/v1/audit/requests", params={"actor": "pat@example.com"}, headers=headers).json()[
        "requests"
    ]
    assert [(r["method"], r["route"], r["status"]) for r in log] == [
        ("POST", "/v1/tokens", 201),
        ("PUT", "/v1/fleet", 200),
    ]
