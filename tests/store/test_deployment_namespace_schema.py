"""Migration 0006 on a database that already holds deployments: every existing deployment, replica and ledger row
lands in the `default` namespace and keeps its ledger; the same name can then exist in a second namespace; the
migrated schema is the one the models declare; and the downgrade puts the old keys back."""

from __future__ import annotations

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from store.db import create_engine
from store.migrate import alembic_config, upgrade
from store.models import Base

SEED_0005 = [
    "INSERT INTO inference_classes (name, api_version, spec) VALUES ('h200', 'modelplane.ai/v1alpha1', '{}')",
    "INSERT INTO clusters (name, api_version, labels, taints) VALUES ('east', 'modelplane.ai/v1alpha1', '{}', '[]')",
    "INSERT INTO pools (cluster, name, position, class_name, shape, node_count) "
    "VALUES ('east', 'serve', 0, 'h200', 'kubernetes', 2)",
    "INSERT INTO model_deployments (name, spec, replicas, status) VALUES ('llama', '{}', 1, '{}')",
    "INSERT INTO model_replicas (name, deployment, cluster, replica_index, spec, state) "
    "VALUES ('llama-east-0', 'llama', 'east', 0, '{}', 'ready')",
    "INSERT INTO replica_pool_usage (replica, engine, pool_id, nodes) SELECT 'llama-east-0', 'serve', id, 1 FROM pools",
]


OURS = {"model_deployments", "model_replicas", "replica_pool_usage", "model_caches", "pools"}


def _table_of(difference: object) -> str | None:
    """The table an autogenerate difference is about (a column change comes as a list of tuples)."""
    item = difference[0] if isinstance(difference, list) else difference
    for part in item[1:]:
        table = getattr(part, "table", None)
        if table is not None:
            return table.name
        if getattr(part, "name", None) and hasattr(part, "columns"):
            return part.name
        if isinstance(part, str):
            return part
    return None


async def _run(url: str, statements: list[str]) -> list[tuple]:
    engine = create_engine(url)
    try:
        async with engine.begin() as connection:
            rows: list[tuple] = []
            for statement in statements:
                result = await connection.execute(text(statement))
                rows = [tuple(r) for r in result] if result.returns_rows else []
            return rows
    finally:
        await engine.dispose()


async def test_existing_deployments_move_to_default_and_names_repeat_across_namespaces(
    empty_database_url: str,
) -> None:
    engine = create_engine(empty_database_url)
    try:
        await upgrade(engine, "0005")
        await _run(empty_database_url, SEED_0005)
        await upgrade(engine)
        async with engine.connect() as connection:
            differences = await connection.run_sync(
                lambda c: compare_metadata(MigrationContext.configure(c), Base.metadata)
            )
    finally:
        await engine.dispose()
    assert [d for d in differences if _table_of(d) in OURS] == []
    assert await _run(
        empty_database_url,
        [
            "SELECT d.namespace, d.name, r.namespace, r.name, u.namespace, u.nodes FROM model_deployments d "
            "JOIN model_replicas r ON r.deployment = d.name JOIN replica_pool_usage u ON u.replica = r.name",
        ],
    ) == [("default", "llama", "default", "llama-east-0", "default", 1)]

    # The same deployment and replica names in another namespace are other rows, with their own ledger.
    await _run(
        empty_database_url,
        [
            "INSERT INTO model_deployments (namespace, name, spec, replicas, status) VALUES ('prod', 'llama', '{}', 1, '{}')",
            "INSERT INTO model_replicas (namespace, name, deployment, cluster, replica_index, spec, state) "
            "VALUES ('prod', 'llama-east-0', 'llama', 'east', 0, '{}', 'ready')",
            "INSERT INTO replica_pool_usage (namespace, replica, engine, pool_id, nodes) "
            "SELECT 'prod', 'llama-east-0', 'serve', id, 1 FROM pools",
        ],
    )
    # A replica cannot belong to a deployment of another namespace.
    with pytest.raises(IntegrityError, match="fk_model_replicas_namespace_model_deployments"):
        await _run(
            empty_database_url,
            [
                "INSERT INTO model_replicas (namespace, name, deployment, cluster, replica_index, spec) "
                "VALUES ('staging', 'llama-east-1', 'llama', 'east', 1, '{}')",
            ],
        )
    # Deleting one namespace's deployment cascades to its own replicas and ledger only.
    assert await _run(
        empty_database_url,
        [
            "DELETE FROM model_deployments WHERE namespace = 'prod'",
            "SELECT namespace, replica FROM replica_pool_usage",
        ],
    ) == [("default", "llama-east-0")]
    with pytest.raises(IntegrityError, match="ck_pools_max_node_count"):
        await _run(empty_database_url, ["UPDATE pools SET max_node_count = 0"])


async def test_downgrade_restores_the_single_name_keys(empty_database_url: str) -> None:
    engine = create_engine(empty_database_url)
    try:
        await upgrade(engine, "0005")
        await _run(empty_database_url, SEED_0005)
        await upgrade(engine)

        def _downgrade(connection: object) -> None:
            config = alembic_config(str(engine.url))
            config.attributes["connection"] = connection
            command.downgrade(config, "0005")

        async with engine.begin() as connection:
            await connection.run_sync(_downgrade)
    finally:
        await engine.dispose()
    assert await _run(
        empty_database_url,
        [
            "SELECT r.name, u.nodes FROM model_replicas r JOIN replica_pool_usage u ON u.replica = r.name",
        ],
    ) == [("llama-east-0", 1)]
