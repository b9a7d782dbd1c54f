"""`GET /v1/usage` and `berth usage` as a tenant and an operator see them: GPU-hours from the ledger, exact to the
claims, a tenant's own only, and bad input refused naming what is wrong."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import typer
from sqlalchemy import text
from typer.testing import CliRunner

from cli.usage import usage
from tests.api.stack import Stack


async def _claimed_seconds(stack: Stack, allocation_id: str) -> float:
    """GPU-seconds the claims table says the allocation held (one claim per GPU)."""
    async with stack.lab.sessions() as session:
        seconds = await session.execute(
            text(
                "SELECT sum(extract(epoch FROM released_at - claimed_at)) FROM allocation_resource_claims "
                "WHERE allocation_id = :id"
            ),
            {"id": allocation_id},
        )
        return float(seconds.scalar_one())


async def test_a_tenant_reads_its_own_usage_and_an_operator_everyones(stack: Stack) -> None:
    started = datetime.now(UTC) - timedelta(seconds=1)
    held = await stack.create(2)
    await stack.wait_for(held, "active")
    assert (await stack.http.delete(f"/v1/allocations/{held}", headers=stack.acme)).status_code == 202
    await stack.wait_for(held, "released")
    theirs = await stack.create(2, who=stack.globex)  # on `big` (`slow`, the 1-GPU host, never boots)
    await stack.wait_for(theirs, "active")

    mine = await stack.http.get("/v1/usage", params={"from": started.isoformat()}, headers=stack.acme)
    assert mine.status_code == 200, mine.text
    report = mine.json()
    assert [row["tenant"] for row in report["rows"]] == ["acme"]  # globex's usage is not acme's to read
    row = report["rows"][0]
    assert abs(row["gpu_hours"] * 3600 - await _claimed_seconds(stack, held)) < 0.01
    assert (row["allocations"], row["peak_gpus"]) == (1, 2)
    assert report["fleet_gpus"] > 0 and 0 < row["share_of_fleet"] < 1

    everyone = await stack.http.get(
        "/v1/usage", params={"from": started.isoformat(), "by": "tenant,product,pool"}, headers=stack.admin
    )
    assert everyone.status_code == 200, everyone.text
    rows = {(r["tenant"], r["pool"]): r for r in everyone.json()["rows"]}
    assert set(rows) == {("acme", "lab-1/slices"), ("globex", "lab-1/slices")}
    assert rows[("globex", "lab-1/slices")]["gpu_hours"] > 0  # still held: counted up to now
    assert rows[("globex", "lab-1/slices")]["product"] == rows[("acme", "lab-1/slices")]["product"]
    by_day = await stack.http.get(
        "/v1/usage", params={"from": started.isoformat(), "bucket": "hour"}, headers=stack.admin
    )
    assert all(r["bucket"] is not None for r in by_day.json()["rows"])

    forbidden = await stack.http.get("/v1/usage", params={"tenant": "globex"}, headers=stack.acme)
    assert forbidden.status_code == 403 and forbidden.json()["error"]["code"] == "forbidden"
    assert (await stack.http.delete(f"/v1/allocations/{theirs}", headers=stack.globex)).status_code == 202
    await stack.wait_for(theirs, "released")


async def test_bad_usage_queries_are_refused_naming_the_field(stack: Stack) -> None:
    cases = [
        ({"from": "2026-11-02T00:00:00Z", "to": "2026-11-01T00:00:00Z"}, "invalid_window", "query.from"),
        ({"from": "2026-11-01T00:00:00"}, "invalid_window", "query.from"),
        ({"by": "tenant,colour"}, "unknown_grouping", "query.by"),
        ({"by": "tenant,tenant"}, "unknown_grouping", "query.by"),
        ({"from": "2020-01-01T00:00:00Z", "bucket": "hour"}, "too_many_buckets", "query.bucket"),
    ]
    for params, code, field in cases:
        answer = await stack.http.get("/v1/usage", params=params, headers=stack.admin)
        assert answer.status_code == 422, (params, answer.text)
        error = answer.json()["error"]
        assert error["code"] == code and error["details"][0]["field"] == field, (params, error)
    bucket = await stack.http.get("/v1/usage", params={"bucket": "week"}, headers=stack.admin)
    assert bucket.status_code == 422 and "bucket" in bucket.text


def test_the_cli_refuses_bad_flags_in_one_line_before_asking_the_api() -> None:
    """Nothing listens at the API's address: each refusal comes before any call."""
    runner = CliRunner()
    cli = typer.Typer(add_completion=False)
    cli.command()(usage)
    for args, message in [
        (["--from", "2026-11-02", "--to", "2026-11-01"], "--from (2026-11-02T00:00:00+00:00) is not before --to"),
        (["--by", "tenant,colour"], "--by: cannot group usage by 'colour': choose from tenant, product, region"),
        (["--bucket", "week"], "--bucket 'week': choose from hour, day"),
        (["--from", "last tuesday"], "--from 'last tuesday' is not a time"),
    ]:
        result = runner.invoke(cli, [*args, "--api", "http://127.0.0.1:9", "--token", "t"])
        assert result.exit_code == 1, result.output
        assert message in result.output and "Traceback" not in result.output, result.output
