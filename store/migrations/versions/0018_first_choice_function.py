"""a region's placement decision recorded in one statement (issue 28, item 5)

`berth_record_first_choice` takes the region's decision lock (the same transaction-scoped advisory lock every other
region-wide step takes), checks that the plans in progress on the chosen node that are new since the decision was
ranked still leave it room (their GPUs within `spare`, the free GPUs the ranking saw there beyond its own; plans that
ended meanwhile, claimed or given up, only left more), and if so records the first choice (and takes a placed request out of its queue), all inside the
database: the lock is held for one function's work, not for the control worker's round trips between statements.
It answers whether it recorded and how long it waited for the lock and held it (`store/decisions.py`).

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

FUNCTION = """
CREATE FUNCTION berth_record_first_choice(
    lock_key bigint, allocation text, chosen text, expected jsonb, spare integer, planning_states text[],
    leave_queue boolean
) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    asked timestamptz := clock_timestamp();
    locked timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock(lock_key);
    locked := clock_timestamp();
    IF expected IS NOT NULL AND (
        SELECT coalesce(sum(p.gpus), 0)
          FROM (SELECT a.id, a.gpu_count AS gpus FROM allocations a
                 WHERE a.state = ANY(planning_states) AND a.node_id = chosen AND a.id <> allocation
                UNION ALL
                SELECT q.allocation_id, q.gpu_count FROM queue_entries q
                 WHERE q.node = chosen AND q.allocation_id <> allocation) p
         WHERE NOT expected @> jsonb_build_array(jsonb_build_array(p.id, p.gpus))
    ) > spare THEN
        RETURN jsonb_build_object(
            'recorded', false,
            'waited_ms', 1000 * extract(epoch FROM locked - asked),
            'held_ms', 1000 * extract(epoch FROM clock_timestamp() - locked));
    END IF;
    UPDATE allocations SET state = 'planning', node_id = chosen WHERE id = allocation;
    IF leave_queue THEN
        DELETE FROM queue_entries WHERE allocation_id = allocation;
    END IF;
    RETURN jsonb_build_object(
        'recorded', true,
        'waited_ms', 1000 * extract(epoch FROM locked - asked),
        'held_ms', 1000 * extract(epoch FROM clock_timestamp() - locked));
END $$;
"""


def upgrade() -> None:
    op.execute(FUNCTION)


def downgrade() -> None:
    op.execute("DROP FUNCTION berth_record_first_choice(bigint, text, text, jsonb, integer, text[], boolean)")
