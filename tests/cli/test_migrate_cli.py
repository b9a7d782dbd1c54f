"""`berth migrate`, and `berth migrate --wait` as a Kubernetes init container runs it while the migration Job has
not finished: it migrates nothing, and lets its pod start only once the schema is this version's."""

from __future__ import annotations

from typer.testing import CliRunner

from cli.main import app
from store.migrate import head

runner = CliRunner()


def test_waiting_for_the_schema_fails_until_the_migration_has_run(empty_database_url: str) -> None:
    env = {"BERTH_DATABASE_URL": empty_database_url}
    waited = runner.invoke(app, ["migrate", "--wait", "0"], env=env)
    assert waited.exit_code == 1
    assert waited.output.strip() == (
        f"error: the database schema is at nothing, not {head()}, after 0 s: has "
        "`berth migrate` (the migration Job) run?"
    )
    migrated = runner.invoke(app, ["migrate"], env=env)
    assert (migrated.exit_code, migrated.output.strip()) == (0, "database schema is up to date")
    ready = runner.invoke(app, ["migrate", "--wait", "30"], env=env)
    assert (ready.exit_code, ready.output.strip()) == (0, f"database schema is at {head()}")
