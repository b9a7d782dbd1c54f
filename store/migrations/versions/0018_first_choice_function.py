"""a region's placement decision recorded in one statement

`berth_record_first_choice` takes the region's decision lock (the same transaction-scoped advisory lock every other
region-wide step takes) and checks what allocations the ranking did not see on the chosen node have taken there
since (planned, set aside by a queue's pass, or claimed). If that still leaves the node room (within `spare`, the
compatible free GPUs the ranking saw there beyond its own request; what ended meanwhile only left more), it records
the first choice (and takes a placed request out of its queue), all inside the database: the lock is held for one
function's work, not for the control worker's round trips between statements. It answers whether it recorded and
how long it waited for the lock and held it (`store/decisions.py`).

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
    lock_key bigint, allocation text, chosen text, seen text[], spare integer, planning_states text[],
    leave_queue boolean
) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    asked timestamptz := clock_timestamp();
    locked timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock(lock_key);
    locked := clock_timestamp();
    -- GPUs taken on the chosen node since the ranking's read, by allocations it did not see there: planned,
    -- set aside by a queue's pass, or already claimed (a plan made since the read may have become claims).
    IF seen IS NOT NULL AND (
        SELECT coalesce(sum(taken.gpus), 0)
          FROM (SELECT holder.id, max(holder.gpus) AS gpus
                  FROM (SELECT a.id, a.gpu_count AS gpus FROM allocations a
                         WHERE a.state = ANY(planning_states) AND a.node_id = chosen
                        UNION ALL
                        SELECT q.allocation_id, q.gpu_count FROM queue_entries q WHERE q.node = chosen
                        UNION ALL
                        SELECT c.allocation_id, count(*) FROM node_resource_slots s
                          JOIN allocation_resource_claims c ON c.slot_id = s.id AND c.released_at IS NULL
                         WHERE s.node_id = chosen
                         GROUP BY c.allocation_id) AS holder
                 WHERE holder.id <> allocation AND NOT holder.id = ANY(seen)
                 GROUP BY holder.id) AS taken
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
    op.execute("DROP FUNCTION berth_record_first_choice(bigint, text, text, text[], integer, text[], boolean)")
