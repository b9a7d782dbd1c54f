"""A real OIDC provider for the tests, run as its own process on a free loopback port: oidc-provider-mock (from
PyPI, built on authlib) with its real discovery document, JWKS, authorization endpoint (code flow) and token endpoint
(authorization code and refresh token grants), plus what the tests need that a real provider does on its own:

- `POST /test/rotate`: a new signing key replaces the old one in the JWKS, as a provider rotates its keys (Google
  every few weeks, Keycloak and Dex on demand). Tokens signed after it carry the new key's id (`kid`).
- `POST /test/sign`: the given claims signed with the provider's current key, for the tokens a real provider never
  issues on request (already expired, not yet valid, for another audience).
- `POST /test/publish`: another public key (a JWK with its `alg`) in the JWKS after the provider's own, its
  algorithm announced in the discovery document, as a provider that signs with an RSA and an EC key publishes both.
- The client-credentials grant, for the control plane's own token at Temporal (config/temporal_credentials.py).
- A refresh answers with a fresh ID token too, as Keycloak, Dex, Okta and Google do (OpenID Connect Core 1.0,
  section 12.2: "Upon successful validation of the Refresh Token, the response body is the Token Response of
  Section 3.1.3.3 ... it might not contain an id_token"); the mock's own refresh answers an access token only.

Users are put with the mock's own `PUT /users/<sub>` (their claims: email, groups). Run:
`python -m tests.oidc_provider [--token-max-age SECONDS]`; it prints `listening on <port>` once it serves.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from datetime import timedelta
from typing import Any

warnings.filterwarnings("ignore", message=".*authlib.jose module is deprecated.*")

import flask  # noqa: E402
import oidc_provider_mock  # noqa: E402
import werkzeug.serving  # noqa: E402
from authlib import jose as authlib_jose  # noqa: E402  (the mock keeps its key as authlib's RSAKey)
from joserfc import jwt  # noqa: E402
from joserfc.jwk import RSAKey  # noqa: E402


def _sign(claims: dict[str, Any]) -> str:
    """`claims` as a JWT signed RS256 with the provider's current key, its id in the header."""
    storage = flask.g.oidc_provider_mock_storage
    private = storage.jwk.as_dict(is_private=True)
    return jwt.encode({"alg": "RS256", "kid": private["kid"]}, claims, RSAKey.import_key(private))


def build(token_max_age: int) -> flask.Flask:
    app = oidc_provider_mock.app(access_token_max_age=timedelta(seconds=token_max_age))
    app.debug = False

    @app.post("/test/rotate")
    def rotate() -> flask.Response:
        storage = flask.g.oidc_provider_mock_storage
        storage.jwk = authlib_jose.RSAKey.generate_key(is_private=True)
        return flask.jsonify({"kid": storage.jwk.as_dict()["kid"]})

    @app.post("/test/sign")
    def sign() -> flask.Response:
        return flask.jsonify({"token": _sign(flask.request.get_json(force=True))})

    published: list[dict[str, Any]] = []

    @app.post("/test/publish")
    def publish() -> flask.Response:
        published.append(flask.request.get_json(force=True))
        return flask.jsonify({"keys": len(published)})

    @app.after_request
    def with_published(response: flask.Response) -> flask.Response:
        path = flask.request.path
        if not published or response.status_code != 200 or path not in ("/jwks", "/.well-known/openid-configuration"):
            return response
        document = json.loads(response.get_data())
        if path == "/jwks":
            document["keys"] += published
        else:
            document["id_token_signing_alg_values_supported"] += [key["alg"] for key in published]
        response.set_data(json.dumps(document))
        return response

    @app.before_request
    def client_credentials() -> flask.Response | None:
        """The client-credentials grant (RFC 6749 section 4.4), which the mock lacks: a JWT access token for the
        client itself, its `permissions` claim the `ns:role` scopes it asked for, as a provider configured for
        Temporal's default claim mapper puts a client's roles there (Keycloak's client roles mapper, an Okta
        custom claim). Any secret will do, as for the mock's other grants."""
        request = flask.request
        if request.path != "/oauth2/token" or request.form.get("grant_type") != "client_credentials":
            return None
        client = request.authorization.username if request.authorization else None
        if not client:
            return flask.make_response(flask.jsonify({"error": "invalid_client"}), 401)
        now = int(time.time())
        permissions = [s for s in request.form.get("scope", "").split() if ":" in s]
        token = _sign(
            {
                "iss": request.host_url.rstrip("/"),
                "sub": client,
                "aud": "temporal",
                "iat": now,
                "exp": now + token_max_age,
                "permissions": permissions,
            }
        )
        return flask.jsonify({"access_token": token, "token_type": "Bearer", "expires_in": token_max_age})

    @app.after_request
    def id_token_on_refresh(response: flask.Response) -> flask.Response:
        request = flask.request
        if request.path != "/oauth2/token" or request.form.get("grant_type") != "refresh_token":
            return response
        if response.status_code != 200:
            return response
        answer = json.loads(response.get_data())
        storage = flask.g.oidc_provider_mock_storage
        refresh = storage.get_refresh_token(answer.get("refresh_token") or request.form.get("refresh_token", ""))
        user = storage.get_user(refresh.user_id) if refresh is not None else None
        if user is None or "id_token" in answer:
            return response
        now = int(time.time())
        client = request.authorization.username if request.authorization else request.form.get("client_id")
        claims = {
            **user.claims,
            "sub": user.sub,
            "iss": request.host_url.rstrip("/"),
            "aud": client,
            "iat": now,
            "exp": now + token_max_age,
        }
        answer["id_token"] = _sign(claims)
        response.set_data(json.dumps(answer))
        return response

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--token-max-age", type=int, default=3600)
    args = parser.parse_args()
    os.environ["AUTHLIB_INSECURE_TRANSPORT"] = "1"  # http on loopback, as the mock itself allows
    server = werkzeug.serving.make_server("127.0.0.1", 0, build(args.token_max_age), threaded=True)
    print(f"listening on {server.server_port}", flush=True)
    sys.stdout.close()
    server.serve_forever(poll_interval=0.1)


if __name__ == "__main__":
    main()
