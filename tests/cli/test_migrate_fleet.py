"""`berth migrate --fleet FILE`: a control plane's first start, before its API is up, migrates the database and
loads its first fleet in one step; run again (every deploy runs it), it leaves the fleet the database holds alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

from typer.testing import CliRunner

from cli.main import app
from fleet.loader import load_fleet
from store.apply import ApplyResult, apply_fleet
from store.db import create_engine, session_factory

runner = CliRunner()
EXAMPLE_FLEET = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"


def _applied_again(url: str, path: Path) -> ApplyResult:
    """What applying `path` would change now, rolled back (the database is left as it is)."""

    async def apply() -> ApplyResult:
        engine = create_engine(url, pool_size=1)
        try:
            async with session_factory(engine)() as session:
                result = await apply_fleet(session, load_fleet([path]))
                await session.rollback()
                return result
        finally:
            await engine.dispose()

    return asyncio.run(apply())


def test_the_first_fleet_is_loaded_into_an_empty_database_and_only_then(
    empty_database_url: str, tmp_path: Path
) -> None:
    env = {"BERTH_DATABASE_URL": empty_database_url}
    first = runner.invoke(app, ["migrate", "--fleet", str(EXAMPLE_FLEET)], env=env)
    assert first.exit_code == 0, first.output
    lines = first.output.strip().splitlines()
    assert lines[0] == "database schema is up to date"
    assert lines[1].startswith("first fleet loaded: ") and "created, 0 unchanged" in lines[1], lines

    again = _applied_again(empty_database_url, EXAMPLE_FLEET)
    assert again.unchanged and not [c for c in again.changes if c.action in ("created", "updated")], again  # all there

    smaller = tmp_path / "regions.yaml"
    smaller.write_text(EXAMPLE_FLEET.read_text().split("\n---\n", 1)[0] + "\n")
    again = runner.invoke(app, ["migrate", "--fleet", str(smaller)], env=env)
    assert again.exit_code == 0, again.output
    assert again.output.strip().splitlines()[1] == (
        "the database already holds a fleet: left as it is (`berth apply -f` changes it)"
    )


def test_a_bad_fleet_file_fails_in_one_line_before_anything_is_written(empty_database_url: str, tmp_path: Path) -> None:
    env = {"BERTH_DATABASE_URL": empty_database_url}
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: berth.dev/v1alpha1\nkind: Nonsense\nmetadata: {name: x}\n")
    done = runner.invoke(app, ["migrate", "--fleet", str(bad)], env=env)
    assert done.exit_code == 1 and "Traceback" not in done.output
    [line] = [line for line in done.output.splitlines() if line.startswith("error: ")]
    assert line == "error: the fleet file has 1 problem:" and "unknown kind 'Nonsense'" in done.output, done.output
    waited = runner.invoke(app, ["migrate", "--wait", "0"], env=env)  # not even migrated
    assert waited.exit_code == 1 and "at nothing" in waited.output, waited.output
