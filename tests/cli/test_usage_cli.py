"""`berth usage` under `-o json`: a flag the CLI could not read is refused as every command refuses one, with the
code `invalid_argument` and a message naming the flag, one JSON object on stderr, before anything is asked of the
API (nothing listens at the address these runs give)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--by", "tenant,colour"], "--by: cannot group usage by 'colour'"),
        (["--bucket", "week"], "--bucket 'week': choose from hour, day"),
        (["--from", "2026-11-02", "--to", "2026-11-01"], "--from (2026-11-02T00:00:00+00:00) is not before --to"),
        (["--from", "last tuesday"], "--from 'last tuesday' is not a time"),
    ],
)
def test_a_bad_flag_is_an_invalid_argument_under_json_output(flags: list[str], message: str) -> None:
    result = runner.invoke(app, ["usage", *flags, "-o", "json", "--api", "http://127.0.0.1:9", "--token", "t"])
    assert (result.exit_code, result.stdout) == (1, ""), result.output
    assert "Traceback" not in result.stderr
    error = json.loads(result.stderr)["error"]
    assert error["code"] == "invalid_argument", error
    assert error["message"].startswith(message), error
