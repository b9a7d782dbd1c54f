"""Every part of how the API verifies ID tokens is an operator's setting (`BERTH_OIDC_*`), none a constant in the
code: what an operator sets reaches the verifier, and a value out of bounds stops the API from starting."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from config.identity import OidcSettings
from config.settings import Settings

ENVIRONMENT = {
    "BERTH_OIDC_ISSUER_URL": "https://login.example.com",
    "BERTH_OIDC_CLIENT_ID": "berth-cli",
    "BERTH_OIDC_USERNAME_CLAIM": "preferred_username",
    "BERTH_OIDC_GROUPS_CLAIM": "roles",
    "BERTH_OIDC_ROLES": '{"sre": ["operator"]}',
    "BERTH_OIDC_LEEWAY_SECONDS": "30",
    "BERTH_OIDC_JWKS_REFRESH_SECONDS": "5",
    "BERTH_OIDC_JWKS_MAX_AGE_SECONDS": "120",
}


def test_each_oidc_setting_reaches_the_verifier(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    oidc = Settings().oidc
    assert oidc == OidcSettings(
        issuer="https://login.example.com",
        client_id="berth-cli",
        username_claim="preferred_username",
        groups_claim="roles",
        roles={"sre": ["operator"]},
        leeway_seconds=30,
        jwks_refresh_seconds=5,
        jwks_max_age_seconds=120,
    )
    # None is left at a default: each field of OidcSettings has its variable.
    assert {name for name, field in OidcSettings.model_fields.items() if getattr(oidc, name) == field.default} == set()


def test_defaults_are_the_verifiers_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BERTH_OIDC_ISSUER_URL", "https://login.example.com")
    monkeypatch.setenv("BERTH_OIDC_CLIENT_ID", "berth-cli")
    oidc = Settings().oidc
    assert oidc is not None
    assert (oidc.leeway_seconds, oidc.jwks_refresh_seconds, oidc.jwks_max_age_seconds) == (60, 10.0, 300.0)


@pytest.mark.parametrize(
    ("variable", "value"),
    [("BERTH_OIDC_LEEWAY_SECONDS", "301"), ("BERTH_OIDC_JWKS_MAX_AGE_SECONDS", "0")],
)
def test_a_setting_out_of_bounds_is_refused(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    monkeypatch.setenv("BERTH_OIDC_ISSUER_URL", "https://login.example.com")
    monkeypatch.setenv("BERTH_OIDC_CLIENT_ID", "berth-cli")
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError, match=variable.removeprefix("BERTH_OIDC_").lower()):
        Settings().oidc  # noqa: B018  (the property builds the verifier's settings, which checks them)
