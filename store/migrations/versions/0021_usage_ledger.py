"""the usage ledger: what each tenant held, exact to the second, its rollup, and decayed usage for fair sharing

- `usage_intervals`: one row per billed interval. An allocation's attempt holds GPUs from the transaction that
  recorded its claims to the one that released the last of them, whatever ended it; a ModelDeployment replica's
  engine charges its pool's nodes from its ledger row's insert to its delete; a reservation's promised window is a
  row of its own kind (held for the tenant, not used). Written by triggers on `allocation_resource_claims`,
  `replica_pool_usage` and `reservations`, in the transaction that changed them: no path that takes or gives back
  capacity (a workflow, the reconciler, an operator's SQL) can leave the ledger behind, and none can write it twice.
- `usage_totals`: GPU- and node-seconds of closed intervals per (kind, tenant, product, region), added at each
  close: `berth_gpu_seconds_total` reads it (plus the open intervals so far), never memory.
- `usage_hourly` and `usage_rollup`: intervals older than the retention rolled up per hour; `rolled_until` is the
  instant before which the hourly rows hold the usage (an interval still raw then counts only after it).
- `usage_decay`: each tenant's decayed GPU-seconds at `as_of` for one half-life, folded forward by the admission
  pass so that decayed usage needs only the intervals since.
- `cohorts.usage_half_life_seconds`: a fair-sharing root's `fairSharing.usageHalfLife`; NULL keeps instantaneous
  shares.

Claims already recorded are backfilled into the ledger, so the history of a running installation is not lost.

Revision ID: 0021
Revises: 0020
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

_KEY = ("kind", "tenant", "gpu_product", "region", "pool", "priority_class", "shape")

# An attempt's interval ends with its last claim's release. Why it ended comes from the step the allocation's trail
# recorded just before (every release writes its trail first), or, for a step that names no ending (a cancellation
# in the middle of an attempt), from the allocation's final state once it has one.
_END_REASON = """
CREATE FUNCTION usage_end_reason(allocation text) RETURNS text LANGUAGE sql STABLE AS $$
  SELECT coalesce(
    (SELECT CASE e.step
              WHEN 'release' THEN 'released' WHEN 'expire' THEN 'expired' WHEN 'preempt' THEN 'preempted'
              WHEN 'cancel' THEN 'cancelled' WHEN 'replace' THEN 'replaced' WHEN 'attempt_failed' THEN 'attempt_failed'
              WHEN 'failed' THEN 'failed' END
       FROM allocation_events AS e WHERE e.allocation_id = allocation ORDER BY e.id DESC LIMIT 1),
    (SELECT a.state FROM allocations AS a
      WHERE a.id = allocation AND a.state IN ('released', 'failed', 'cancelled', 'expired', 'preempted')))
$$
"""

_OPEN_CLAIMS = """
CREATE FUNCTION usage_open_claims() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO usage_intervals (kind, subject, attempt, tenant, gpu_product, region, pool, priority_class, shape,
                               node_id, gpus, started_at, first)
  SELECT 'allocation', n.allocation_id, n.attempt, a.tenant, coalesce(p.gpu_product, a.gpu_product),
         coalesce(c.region, a.region), p.cluster || '/' || p.name, a.request->>'priority_class', a.shape,
         n.node_id, n.gpus, n.claimed_at,
         NOT EXISTS (SELECT 1 FROM usage_intervals AS x WHERE x.kind = 'allocation' AND x.subject = n.allocation_id)
    FROM (SELECT allocation_id, attempt, min(node_id) AS node_id, count(*) AS gpus, min(claimed_at) AS claimed_at
            FROM new_claims WHERE released_at IS NULL GROUP BY allocation_id, attempt) AS n
    JOIN allocations AS a ON a.id = n.allocation_id
    LEFT JOIN nodes AS nd ON nd.name = n.node_id
    LEFT JOIN pools AS p ON p.id = nd.pool_id
    LEFT JOIN clusters AS c ON c.name = p.cluster
  ON CONFLICT (kind, subject, attempt) DO UPDATE SET gpus = usage_intervals.gpus + EXCLUDED.gpus;
  RETURN NULL;
END $$
"""

_CLOSE_CLAIMS = """
CREATE FUNCTION usage_close_claims() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  WITH released AS (
    SELECT n.allocation_id, n.attempt, max(n.released_at) AS released_at
      FROM new_claims AS n JOIN old_claims AS o ON o.id = n.id
     WHERE o.released_at IS NULL AND n.released_at IS NOT NULL
     GROUP BY n.allocation_id, n.attempt
  ), closed AS (
    UPDATE usage_intervals AS u
       SET ended_at = greatest(r.released_at, u.started_at), end_reason = usage_end_reason(u.subject)
      FROM released AS r
     WHERE u.kind = 'allocation' AND u.subject = r.allocation_id AND u.attempt = r.attempt AND u.ended_at IS NULL
       AND NOT EXISTS (SELECT 1 FROM allocation_resource_claims AS h
                        WHERE h.allocation_id = r.allocation_id AND h.attempt = r.attempt AND h.released_at IS NULL)
    RETURNING u.*
  )
  INSERT INTO usage_totals AS t (kind, tenant, gpu_product, region, gpu_seconds, node_seconds)
  SELECT kind, tenant, coalesce(gpu_product, ''), coalesce(region, ''),
         sum(gpus * extract(epoch FROM ended_at - started_at)), 0
    FROM closed GROUP BY kind, tenant, coalesce(gpu_product, ''), coalesce(region, '')
  ON CONFLICT (kind, tenant, gpu_product, region)
  DO UPDATE SET gpu_seconds = t.gpu_seconds + EXCLUDED.gpu_seconds;
  RETURN NULL;
END $$
"""

# A final state reached after an interval closed with a step that named no ending (a cancellation mid-attempt).
_FINAL_REASON = """
CREATE FUNCTION usage_final_reason() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  UPDATE usage_intervals SET end_reason = NEW.state
   WHERE kind = 'allocation' AND subject = NEW.id AND ended_at IS NOT NULL AND end_reason IS NULL;
  RETURN NULL;
END $$
"""

# A replica's engine charges its pool's nodes (the node-cost ledger) from its row's insert to its delete; its
# namespace stands for the tenant (ModelDeployments belong to no tenant).
_REPLICAS = """
CREATE FUNCTION usage_replicas() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO usage_intervals (kind, subject, attempt, tenant, gpu_product, region, pool, shape, nodes, gpus,
                                 started_at)
    SELECT 'replica', NEW.namespace || '/' || NEW.replica || '/' || NEW.engine, 1, 'namespace:' || NEW.namespace,
           p.gpu_product, c.region, p.cluster || '/' || p.name, p.shape, NEW.nodes, 0, now()
      FROM pools AS p LEFT JOIN clusters AS c ON c.name = p.cluster WHERE p.id = NEW.pool_id
    ON CONFLICT (kind, subject, attempt) DO NOTHING;
    RETURN NULL;
  END IF;
  WITH closed AS (
    UPDATE usage_intervals SET ended_at = greatest(now(), started_at), end_reason = 'released'
     WHERE kind = 'replica' AND subject = OLD.namespace || '/' || OLD.replica || '/' || OLD.engine
       AND ended_at IS NULL
    RETURNING *
  )
  INSERT INTO usage_totals AS t (kind, tenant, gpu_product, region, gpu_seconds, node_seconds)
  SELECT kind, tenant, coalesce(gpu_product, ''), coalesce(region, ''), 0,
         sum(nodes * extract(epoch FROM ended_at - started_at))
    FROM closed GROUP BY kind, tenant, coalesce(gpu_product, ''), coalesce(region, '')
  ON CONFLICT (kind, tenant, gpu_product, region)
  DO UPDATE SET node_seconds = t.node_seconds + EXCLUDED.node_seconds;
  RETURN NULL;
END $$
"""

# A reservation's promise, apart from use: its window, cut short where it was cancelled or failed before its end.
_RESERVATIONS = """
CREATE FUNCTION usage_reservations() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO usage_intervals (kind, subject, attempt, tenant, gpu_product, region, node_id, shape, gpus,
                               started_at, ended_at, end_reason)
  VALUES ('reservation', NEW.id, 1, NEW.tenant, NEW.gpu_product, NEW.region, NEW.node_id, NEW.shape, NEW.gpu_count,
          NEW.starts_at,
          CASE WHEN NEW.state IN ('cancelled', 'failed') THEN greatest(NEW.starts_at, least(NEW.ends_at, now()))
               ELSE NEW.ends_at END,
          CASE WHEN NEW.state IN ('ended', 'cancelled', 'failed') THEN NEW.state END)
  ON CONFLICT (kind, subject, attempt)
  DO UPDATE SET ended_at = EXCLUDED.ended_at, end_reason = EXCLUDED.end_reason
   WHERE usage_intervals.end_reason IS NULL;
  RETURN NULL;
END $$
"""

# Every claim recorded before this revision, so an installation's history starts with its first allocation.
_BACKFILL = """
INSERT INTO usage_intervals (kind, subject, attempt, tenant, gpu_product, region, pool, priority_class, shape,
                             node_id, gpus, started_at, ended_at, first, end_reason)
SELECT 'allocation', k.allocation_id, k.attempt, a.tenant, coalesce(p.gpu_product, a.gpu_product),
       coalesce(c.region, a.region), p.cluster || '/' || p.name, a.request->>'priority_class', a.shape, k.node_id,
       k.gpus, k.claimed_at, k.released_at,
       k.attempt = (SELECT min(y.attempt) FROM allocation_resource_claims AS y WHERE y.allocation_id = k.allocation_id),
       CASE WHEN k.released_at IS NOT NULL THEN
         CASE WHEN k.attempt < (SELECT max(x.attempt) FROM allocation_resource_claims AS x
                                 WHERE x.allocation_id = k.allocation_id) THEN 'attempt_failed'
              WHEN a.state IN ('released', 'failed', 'cancelled', 'expired', 'preempted') THEN a.state END END
  FROM (SELECT allocation_id, attempt, min(node_id) AS node_id, count(*) AS gpus, min(claimed_at) AS claimed_at,
               CASE WHEN bool_and(released_at IS NOT NULL) THEN max(released_at) END AS released_at
          FROM allocation_resource_claims GROUP BY allocation_id, attempt) AS k
  JOIN allocations AS a ON a.id = k.allocation_id
  LEFT JOIN nodes AS nd ON nd.name = k.node_id
  LEFT JOIN pools AS p ON p.id = nd.pool_id
  LEFT JOIN clusters AS c ON c.name = p.cluster
"""
_BACKFILL_TOTALS = """
INSERT INTO usage_totals (kind, tenant, gpu_product, region, gpu_seconds, node_seconds)
SELECT kind, tenant, coalesce(gpu_product, ''), coalesce(region, ''),
       sum(gpus * extract(epoch FROM ended_at - started_at)), 0
  FROM usage_intervals WHERE ended_at IS NOT NULL
 GROUP BY kind, tenant, coalesce(gpu_product, ''), coalesce(region, '')
"""


def upgrade() -> None:
    op.create_table(
        "usage_intervals",
        sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("subject", sa.String(800), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("tenant", sa.String(270), nullable=False),
        sa.Column("gpu_product", sa.String(64), nullable=True),
        sa.Column("region", sa.String(253), nullable=True),
        sa.Column("pool", sa.String(507), nullable=True),
        sa.Column("priority_class", sa.String(253), nullable=True),
        sa.Column("shape", sa.String(16), nullable=True),
        sa.Column("node_id", sa.String(253), nullable=True),
        sa.Column("gpus", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("nodes", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_reason", sa.String(32), nullable=True),
        # The allocation's first billed interval (its later attempts' are not): reports count allocations by it.
        sa.Column("first", sa.Boolean(), nullable=False, server_default="true"),
        sa.UniqueConstraint("kind", "subject", "attempt", name=op.f("uq_usage_intervals_kind")),
        sa.CheckConstraint("kind IN ('allocation', 'replica', 'reservation')", name=op.f("ck_usage_intervals_kind")),
        sa.CheckConstraint("ended_at IS NULL OR ended_at >= started_at", name=op.f("ck_usage_intervals_ordered")),
    )
    # A window's report reads the intervals that overlap it: a GiST index on the interval as a range.
    op.execute(
        "CREATE INDEX ix_usage_intervals_span ON usage_intervals "
        "USING gist (tstzrange(started_at, coalesce(ended_at, 'infinity'::timestamptz)))"
    )
    # Decayed usage reads a tenant's intervals ended lately and those still open (store/usage.py).
    op.create_index("ix_usage_intervals_tenant_ended_at", "usage_intervals", ["kind", "tenant", "ended_at"])
    op.create_index(
        "ix_usage_intervals_open", "usage_intervals", ["kind", "tenant"], postgresql_where=sa.text("ended_at IS NULL")
    )
    op.create_index("ix_usage_intervals_subject", "usage_intervals", ["subject"])
    # The reconciler compares the last day's claims with the ledger each minute: claims by when they changed.
    op.create_index("ix_allocation_resource_claims_claimed_at", "allocation_resource_claims", ["claimed_at"])
    op.create_index("ix_allocation_resource_claims_released_at", "allocation_resource_claims", ["released_at"])
    op.create_table(
        "usage_totals",
        *(sa.Column(name, sa.String(507), primary_key=True) for name in ("kind", "tenant", "gpu_product", "region")),
        sa.Column("gpu_seconds", sa.Float(), nullable=False, server_default="0"),
        sa.Column("node_seconds", sa.Float(), nullable=False, server_default="0"),
    )
    op.create_table(
        "usage_hourly",
        sa.Column("hour", sa.DateTime(timezone=True), primary_key=True),
        *(sa.Column(name, sa.String(507), primary_key=True) for name in _KEY),
        sa.Column("gpu_seconds", sa.Float(), nullable=False, server_default="0"),
        sa.Column("node_seconds", sa.Float(), nullable=False, server_default="0"),
        sa.Column("allocations", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("peak_gpus", sa.Integer(), nullable=False, server_default="0"),
    )
    op.create_table(
        "usage_rollup",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("rolled_until", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("id = 1", name=op.f("ck_usage_rollup_one_row")),
    )
    op.execute("INSERT INTO usage_rollup (id, rolled_until) VALUES (1, NULL)")
    op.create_table(
        "usage_decay",
        sa.Column("tenant", sa.String(270), primary_key=True),
        sa.Column("half_life_seconds", sa.Float(), primary_key=True),
        sa.Column("as_of", sa.DateTime(timezone=True), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
    )
    op.add_column("cohorts", sa.Column("usage_half_life_seconds", sa.Float(), nullable=True))
    op.create_check_constraint("usage_half_life", "cohorts", "usage_half_life_seconds > 0")

    for statement in (_END_REASON, _OPEN_CLAIMS, _CLOSE_CLAIMS, _FINAL_REASON, _REPLICAS, _RESERVATIONS):
        op.execute(statement)
    op.execute(
        "CREATE TRIGGER usage_open AFTER INSERT ON allocation_resource_claims REFERENCING NEW TABLE AS new_claims "
        "FOR EACH STATEMENT EXECUTE FUNCTION usage_open_claims()"
    )
    op.execute(
        "CREATE TRIGGER usage_close AFTER UPDATE ON allocation_resource_claims "
        "REFERENCING OLD TABLE AS old_claims NEW TABLE AS new_claims "
        "FOR EACH STATEMENT EXECUTE FUNCTION usage_close_claims()"
    )
    op.execute(
        "CREATE TRIGGER usage_final AFTER UPDATE OF state ON allocations FOR EACH ROW "
        "WHEN (NEW.state IN ('released', 'failed', 'cancelled', 'expired', 'preempted') "
        "AND OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION usage_final_reason()"
    )
    op.execute(
        "CREATE TRIGGER usage_replicas AFTER INSERT OR DELETE ON replica_pool_usage FOR EACH ROW "
        "EXECUTE FUNCTION usage_replicas()"
    )
    op.execute(
        "CREATE TRIGGER usage_reservations AFTER INSERT OR UPDATE OF state ON reservations FOR EACH ROW "
        "EXECUTE FUNCTION usage_reservations()"
    )
    op.execute(_BACKFILL)
    op.execute(_BACKFILL_TOTALS)


def downgrade() -> None:
    op.execute("DROP TRIGGER usage_reservations ON reservations")
    op.execute("DROP TRIGGER usage_replicas ON replica_pool_usage")
    op.execute("DROP TRIGGER usage_final ON allocations")
    op.execute("DROP TRIGGER usage_close ON allocation_resource_claims")
    op.execute("DROP TRIGGER usage_open ON allocation_resource_claims")
    for function in ("usage_reservations", "usage_replicas", "usage_final_reason", "usage_close_claims",
                     "usage_open_claims"):
        op.execute(f"DROP FUNCTION {function}()")
    op.execute("DROP FUNCTION usage_end_reason(text)")
    op.drop_constraint("usage_half_life", "cohorts", type_="check")
    op.drop_column("cohorts", "usage_half_life_seconds")
    op.drop_index("ix_allocation_resource_claims_released_at", "allocation_resource_claims")
    op.drop_index("ix_allocation_resource_claims_claimed_at", "allocation_resource_claims")
    for table in ("usage_decay", "usage_rollup", "usage_hourly", "usage_totals", "usage_intervals"):
        op.drop_table(table)
