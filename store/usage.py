"""The usage ledger: what each tenant held, exact to the second, and the reads made of it.

What starts and ends a billed interval (the one definition; README.md and docs/design.md point here):

- **An allocation's attempt** holds GPUs from the commit that recorded its claims (`record_claims`: one claim per
  GPU, `claimed_at`) to the one that released the last of them (`released_at`), whatever ended it: a release, its
  end (`expired`), preemption (`preempted`), a cancellation, a move off a failed GPU (`replaced`), a failed create or
  readiness after the claim (`attempt_failed`), the allocation failing (`failed`), or the reconciler's repair of a
  stale claim. A quarantine ends it too: the slots are no longer the tenant's, only not yet wiped. An attempt that
  never recorded a claim (refused, planned but not claimed) holds nothing. `end_reason` comes from the step the
  allocation's trail recorded just before the release, else from its final state.
- **A ModelDeployment replica's engine** charges its pool's nodes (the node-cost ledger, `replica_pool_usage`) from
  its row's insert to its delete, billed to `namespace:<namespace>` (a ModelDeployment belongs to no tenant).
- **A reservation** is recorded apart (`kind = reservation`): its promised window, cut short where it was
  cancelled or failed, held for the tenant whether used or not; what its allocation uses is that allocation's own.

The database writes the ledger (triggers of migration 0021) in the transaction that changed the claims, the replica
row or the reservation: nothing can take or give back capacity without it, and nothing writes it twice. This module
only reads it, rolls it up, folds decayed usage forward, and repairs it from the claims where they disagree.

Reports clip each interval to the window (and to now, for one still open), and count an allocation once, where its
first billed interval began (`first`; a later attempt's interval is not a new allocation). Past the retention (90 days by default)
intervals are rolled up per hour and key (`usage_hourly`); a window reaching before `rolled_until` counts whole
hours there, and its peak is the largest sum of the hours' per-key peaks (an upper bound where the report groups
more coarsely than the rollup's key).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

import contracts.usage
from scheduler.quota.usage_decay import half_lives
from scheduler.snapshot import Snapshot

# The report's groupings (contracts/usage.py), each with its ledger column.
GROUPINGS: dict[str, str] = dict(
    zip(contracts.usage.GROUPINGS, ("tenant", "gpu_product", "region", "pool", "priority_class", "shape"), strict=True)
)
DEFAULT_RETENTION = timedelta(days=90)
# Decayed usage is carried forward at most this often (Kueue samples usage every 5 minutes by default). Exact either
# way: a read adds every interval since the carried sum; this bounds how many there are.
FOLD_EVERY = timedelta(minutes=5)


@dataclass(frozen=True)
class UsageQuery:
    start: datetime
    end: datetime
    by: tuple[str, ...] = ("tenant",)
    tenants: frozenset[str] | None = None  # only these tenants' (what the caller may see); None: every tenant's
    bucket: str | None = None  # hour | day: one row per bucket and group


@dataclass(frozen=True)
class UsageRow:
    group: dict[str, str | None]
    bucket: datetime | None
    gpu_seconds: float
    node_seconds: float
    reserved_gpu_seconds: float
    allocations: int
    peak_gpus: int


# -- reports ------------------------------------------------------------------------------------------------------


async def rolled_until(session: AsyncSession) -> datetime | None:
    return (await session.execute(text("SELECT rolled_until FROM usage_rollup WHERE id = 1"))).scalar_one_or_none()


async def report(session: AsyncSession, query: UsageQuery, now: datetime) -> list[UsageRow]:
    """The usage in [start, end) (end at most now) by the query's groups (and buckets), the raw intervals after the
    rollup's instant and the hourly rows before it summed together."""
    end = min(query.end, now)
    if end <= query.start:
        return []
    rolled = await rolled_until(session)
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    names = [GROUPINGS[name] for name in query.by]
    if rolled is not None and query.start < rolled:
        _merge(rows, await _hourly(session, query, min(end, rolled)), names)
    raw_start = max(query.start, rolled) if rolled is not None else query.start
    if raw_start < end:
        _merge(rows, await _raw(session, query, raw_start, end), names)
    columns = query.by
    return [
        UsageRow(
            group=dict(zip(columns, key[1:], strict=True)),
            bucket=key[0],
            gpu_seconds=v["gpu"],
            node_seconds=v["node"],
            reserved_gpu_seconds=v["reserved"],
            allocations=v["allocations"],
            peak_gpus=v["peak"],
        )
        for key, v in sorted(rows.items(), key=lambda kv: tuple("" if k is None else str(k) for k in kv[0]))
    ]


def _group_sql(by: Sequence[str], table: str = "") -> str:
    prefix = f"{table}." if table else ""
    return ", ".join(f"{prefix}{GROUPINGS[name]}" for name in by)


def _bucket_sql(bucket: str | None, column: str) -> str:
    return f"date_trunc('{bucket}', {column}, 'UTC')" if bucket else "NULL::timestamptz"


def _spans(query: UsageQuery) -> str:
    """The CTEs `clipped` (each interval overlapping [:start, :end), clipped to it) and `spans` (with buckets, each
    clipped interval split at the buckets it crosses, so every bucket gets its own part)."""
    group = _group_sql(query.by)
    tenant = "AND tenant = ANY(CAST(:tenants AS text[]))" if query.tenants is not None else ""
    if query.bucket:
        spans = (
            f"SELECT c.*, greatest(c.s, b.at) AS bs, least(c.e, b.at + interval '1 {query.bucket}') AS be, "
            f"b.at AS bucket FROM clipped AS c, LATERAL generate_series({_bucket_sql(query.bucket, 'c.s')}, c.e, "
            f"interval '1 {query.bucket}') AS b(at)"
        )
    else:
        spans = "SELECT c.*, c.s AS bs, c.e AS be, NULL::timestamptz AS bucket FROM clipped AS c"
    return f"""
        clipped AS (
            SELECT kind, first, {group}, gpus, nodes, started_at,
                   greatest(started_at, :start) AS s, least(coalesce(ended_at, :end), :end) AS e
              FROM usage_intervals
             WHERE tstzrange(started_at, coalesce(ended_at, 'infinity'::timestamptz)) && tstzrange(:start, :end)
                   {tenant}
        ), spans AS (
            SELECT * FROM ({spans}) AS split WHERE be > bs OR (be = bs AND started_at = bs)
        )"""


async def _raw(session: AsyncSession, query: UsageQuery, start: datetime, end: datetime) -> list[dict[str, Any]]:
    """One scan of the intervals overlapping [start, end): each group's (and bucket's) sums, and its peak from a
    sweep over its allocations' parts (an end before a start at the same instant: one allocation handing over to
    the next is not an overlap). The sweep sorts by each group's number, not its names: hashed aggregation and an
    integer sort key keep a month of a large fleet well under a second (bench/usage.py)."""
    group = _group_sql(query.by)
    keys = ["bucket", *(GROUPINGS[name] for name in query.by)]
    equal = " AND ".join(
        f"coalesce(s.{k}, 'epoch') = coalesce(t.{k}, 'epoch')"
        if k == "bucket"
        else f"coalesce(s.{k}, '') = coalesce(t.{k}, '')"
        for k in keys
    )
    sql = f"""
        WITH {_spans(query)}, totals AS (
            SELECT row_number() OVER () AS gid, * FROM (
                SELECT bucket, {group},
                       coalesce(sum(gpus * extract(epoch FROM be - bs)) FILTER (WHERE kind = 'allocation'), 0) AS gpu,
                       coalesce(sum(nodes * extract(epoch FROM be - bs)) FILTER (WHERE kind = 'replica'), 0) AS node,
                       coalesce(sum(gpus * extract(epoch FROM be - bs)) FILTER (WHERE kind = 'reservation'), 0)
                           AS reserved,
                       count(*) FILTER (WHERE kind <> 'reservation' AND first AND started_at = bs) AS allocations
                  FROM spans GROUP BY bucket, {group}
            ) AS sums
        ), parts AS (
            SELECT t.gid, s.bs, s.be, s.gpus FROM spans AS s JOIN totals AS t ON {equal}
             WHERE s.kind = 'allocation' AND s.be > s.bs
        ), events AS (
            SELECT gid, bs AS at, gpus AS delta FROM parts
            UNION ALL
            SELECT gid, be AS at, -gpus AS delta FROM parts
        ), peaks AS (
            SELECT gid, max(held) AS peak FROM (
                SELECT gid, delta, sum(delta) OVER (PARTITION BY gid ORDER BY at, delta ROWS UNBOUNDED PRECEDING) AS held
                  FROM events
            ) AS running WHERE delta > 0 GROUP BY gid
        )
        SELECT t.*, coalesce(p.peak, 0) AS peak FROM totals AS t LEFT JOIN peaks AS p ON p.gid = t.gid
    """
    params: dict[str, Any] = {
        "start": start,
        "end": end,
        "tenants": sorted(query.tenants) if query.tenants is not None else None,
    }
    # The sweep sorts every start and end of the window: in memory, not in temporary files.
    await session.execute(text("SET LOCAL work_mem = '64MB'"))
    return [dict(row._mapping) for row in await session.execute(text(sql), params)]


async def _hourly(session: AsyncSession, query: UsageQuery, end: datetime) -> list[dict[str, Any]]:
    """The rolled-up hours in [start, end): whole hours, the first one the hour `start` falls in."""
    group = ", ".join(f"nullif({GROUPINGS[name]}, '') AS {GROUPINGS[name]}" for name in query.by)
    keys = _group_sql(query.by)
    tenant = "AND tenant = ANY(CAST(:tenants AS text[]))" if query.tenants is not None else ""
    sql = f"""
        WITH hours AS (
            SELECT {_bucket_sql(query.bucket, "hour")} AS bucket, hour, {group},
                   sum(gpu_seconds) FILTER (WHERE kind = 'allocation') AS gpu,
                   sum(node_seconds) FILTER (WHERE kind = 'replica') AS node,
                   sum(gpu_seconds) FILTER (WHERE kind = 'reservation') AS reserved,
                   sum(allocations) FILTER (WHERE kind <> 'reservation') AS allocations,
                   sum(peak_gpus) FILTER (WHERE kind = 'allocation') AS peak
              FROM usage_hourly
             WHERE hour >= date_trunc('hour', CAST(:start AS timestamptz), 'UTC') AND hour < :end {tenant}
             GROUP BY 1, hour, {keys}
        )
        SELECT bucket, {keys}, coalesce(sum(gpu), 0) AS gpu, coalesce(sum(node), 0) AS node,
               coalesce(sum(reserved), 0) AS reserved, coalesce(sum(allocations), 0) AS allocations,
               coalesce(max(peak), 0) AS peak
          FROM hours GROUP BY bucket, {keys}
    """
    params: dict[str, Any] = {
        "start": query.start,
        "end": end,
        "tenants": sorted(query.tenants) if query.tenants is not None else None,
    }
    return [dict(row._mapping) for row in await session.execute(text(sql), params)]


def _key(row: Mapping[str, Any], names: Sequence[str]) -> tuple[Any, ...]:
    return (row["bucket"], *(row[name] for name in names))


def _merge(into: dict[tuple[Any, ...], dict[str, Any]], rows: list[dict[str, Any]], names: Sequence[str]) -> None:
    for row in rows:
        key = _key(row, names)
        found = into.setdefault(key, {"gpu": 0.0, "node": 0.0, "reserved": 0.0, "allocations": 0, "peak": 0})
        found["gpu"] += float(row["gpu"])
        found["node"] += float(row["node"])
        found["reserved"] += float(row["reserved"])
        found["allocations"] += int(row["allocations"])
        found["peak"] = max(found["peak"], int(row.get("peak") or 0))


async def fleet_gpus(session: AsyncSession, regions: Sequence[str] | None = None) -> int:
    """The fleet's GPUs as they are now (approved slots; of `regions` only, if given): what a share of the fleet is
    a share of."""
    sql = (
        "SELECT count(*) FROM node_resource_slots AS s JOIN nodes AS n ON n.name = s.node_id "
        "JOIN pools AS p ON p.id = n.pool_id JOIN clusters AS c ON c.name = p.cluster WHERE s.approved"
    )
    if regions is not None:
        sql += " AND c.region = ANY(:regions)"
    return int((await session.execute(text(sql), {"regions": list(regions or ())})).scalar_one())


# -- counters -----------------------------------------------------------------------------------------------------


async def gpu_seconds_totals(session: AsyncSession) -> list[tuple[str, str, str, float]]:
    """(tenant, product, region, GPU-seconds ever) of allocations: closed intervals' totals plus the open ones up to
    `counted_until`. From the database alone, so the counter survives a restart of every part, reads the same from
    every API process, and never goes back: an open interval is counted no further than any close still to come
    can end it, so its close adds at least what it had already counted. Call it in a READ COMMITTED transaction
    (the default): the ledger is read by a statement of its own, after the bound."""
    until = await counted_until(session)
    sql = """
        SELECT tenant, gpu_product, region, sum(seconds) FROM (
            SELECT tenant, gpu_product, region, gpu_seconds AS seconds FROM usage_totals WHERE kind = 'allocation'
            UNION ALL
            SELECT tenant, coalesce(gpu_product, ''), coalesce(region, ''),
                   gpus * greatest(0, extract(epoch FROM CAST(:until AS timestamptz) - started_at))
              FROM usage_intervals WHERE ended_at IS NULL AND kind = 'allocation'
        ) AS t GROUP BY tenant, gpu_product, region ORDER BY 1, 2, 3
    """
    return [(t, p, r, float(s)) for t, p, r, s in await session.execute(text(sql), {"until": until})]


# The start of the oldest transaction still in progress in this database, other than the caller's (autovacuum runs
# no triggers). A statement shows as active a moment before its transaction's start is published: its start is the
# statement's, `query_start`, then.
_OLDEST_IN_PROGRESS = """
SELECT min(coalesce(xact_start, CASE WHEN state = 'active' THEN query_start END)) FROM pg_stat_activity
 WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type <> 'autovacuum worker'
"""


async def counted_until(session: AsyncSession) -> datetime:
    """How far open intervals may be counted without a later close undercutting them: the database's clock, or the
    start of the oldest transaction still in progress if earlier.

    A close ends an interval at its transaction's start (`released_at = now()`) but shows only at its commit. Were a
    scrape between the two to count the still open interval up to its own clock, the scrape after the commit would
    read less, and Prometheus takes any decrease for a counter reset (increase() and rate() add the whole value
    again). Every transaction that can still commit a close is either in progress now, so the bound is at most its
    start, or begins after the clock is read, so it ends intervals after the bound. Bounds only grow, so scrapes
    from any number of API processes read one series that never goes down. A long transaction holds the open part
    back (never down) until it ends; the counter then catches up.

    Three statements, in this order: the clock (and a fresh view of pg_stat_activity, which PostgreSQL otherwise
    keeps for the whole transaction); the transactions in progress, a round trip later, so that one begun before the
    clock shows by then; and, by the caller, the ledger, whose snapshot then holds every close committed by a
    transaction the bound did not see. The API's role must see the other parts' sessions (deploy/ gives every part
    one role; or grant it pg_read_all_stats), with `track_activities` on, PostgreSQL's default."""
    clock, isolation = (
        await session.execute(
            text("SELECT clock_timestamp(), current_setting('transaction_isolation') FROM pg_stat_clear_snapshot()")
        )
    ).one()
    if isolation != "read committed":  # one snapshot for the whole transaction: the ledger's would predate the bound
        raise RuntimeError(f"the usage counter must be read under READ COMMITTED, not {isolation.upper()}")
    oldest: datetime | None = (await session.execute(text(_OLDEST_IN_PROGRESS))).scalar_one()
    return clock if oldest is None else min(clock, oldest)


# -- decayed usage ------------------------------------------------------------------------------------------------


# How much a GPU-second `age` seconds old counts now, 2^(-age / h); clamped where it is below 2^-1000 (nothing).
_WEIGHT = "exp(greatest(-700.0, -ln(2.0) * extract(epoch FROM {age}) / {h}))"


async def decayed_usage(
    session: AsyncSession, half_lives: Mapping[str, float], now: datetime, *, fold: bool
) -> dict[str, float]:
    """Each tenant's GPU-seconds decayed to `now` with its half-life (scheduler/quota/usage_decay.py): its carried sum
    plus its intervals since, read in one statement. `fold`: carry the sums forward to `now` where they are older
    than `FOLD_EVERY` (the admission pass does, under its region's lock); a tenant with no carried sum for its
    half-life (new, or its half-life changed) is summed from its whole history once."""
    if not half_lives:
        return {}
    tenants = sorted(half_lives)
    params = {"tenants": tenants, "lives": [half_lives[t] for t in tenants], "now": now}
    carried: dict[str, tuple[float, float]] = {}  # tenant -> (as_of, its decayed usage now)
    for tenant, as_of, value in await session.execute(text(_CARRIED_AND_SINCE), params):
        carried[tenant] = (as_of, value)
    fresh = [t for t in tenants if t not in carried]
    stamp = now.timestamp()
    result = {tenant: value for tenant, (_, value) in carried.items()}
    if fresh:
        result.update(await _from_history(session, {t: half_lives[t] for t in fresh}, now))
    if fold:
        stale = [t for t in tenants if t in fresh or stamp - carried[t][0] >= FOLD_EVERY.total_seconds()]
        if stale:
            await session.execute(
                text(_FOLD),
                {
                    "tenants": stale,
                    "lives": [half_lives[t] for t in stale],
                    "stamps": [now] * len(stale),
                    "values": [result[t] for t in stale],
                },
            )
        if fresh:  # a half-life that changed leaves its old sums behind
            await session.execute(
                text("DELETE FROM usage_decay WHERE tenant = ANY(:tenants) AND half_life_seconds <> ALL(:lives)"),
                {"tenants": fresh, "lives": sorted(set(half_lives.values()))},
            )
    return result


# Each tenant's carried sum for its half-life, decayed to now, plus its allocation intervals' parts since (those still
# open, and those ended since the oldest sum: two index scans whatever the ledger's age), in one statement and one
# row per tenant: scheduler/quota/usage_decay.py's formula, in PostgreSQL.
_CARRIED_AND_SINCE = f"""
WITH l AS (
    SELECT * FROM unnest(CAST(:tenants AS text[]), CAST(:lives AS float8[])) AS l(tenant, h)
), carried AS (
    SELECT d.tenant, d.as_of, d.value, l.h FROM usage_decay AS d
      JOIN l ON l.tenant = d.tenant AND l.h = d.half_life_seconds
), held AS (
    SELECT tenant, gpus, started_at, ended_at FROM usage_intervals
     WHERE kind = 'allocation' AND tenant = ANY(:tenants) AND ended_at IS NULL
    UNION ALL
    SELECT tenant, gpus, started_at, ended_at FROM usage_intervals
     WHERE kind = 'allocation' AND tenant = ANY(:tenants) AND ended_at > (SELECT min(as_of) FROM carried)
), parts AS (
    SELECT c.tenant, c.as_of, c.value, c.h, x.gpus, greatest(x.started_at, c.as_of) AS s,
           least(coalesce(x.ended_at, :now), :now) AS e
      FROM carried AS c LEFT JOIN held AS x ON x.tenant = c.tenant
)
SELECT tenant, extract(epoch FROM as_of)::float8,
       value * {_WEIGHT.format(age="CAST(:now AS timestamptz) - as_of", h="h")}
       + coalesce(sum(gpus * h / ln(2.0) * ({_WEIGHT.format(age="CAST(:now AS timestamptz) - e", h="h")}
                                           - {_WEIGHT.format(age="CAST(:now AS timestamptz) - s", h="h")}))
                  FILTER (WHERE e > s), 0)
  FROM parts GROUP BY tenant, as_of, value, h
"""

_FOLD = """
INSERT INTO usage_decay (tenant, half_life_seconds, as_of, value)
SELECT * FROM unnest(CAST(:tenants AS text[]), CAST(:lives AS float8[]), CAST(:stamps AS timestamptz[]),
                     CAST(:values AS float8[]))
ON CONFLICT (tenant, half_life_seconds)
DO UPDATE SET as_of = EXCLUDED.as_of, value = EXCLUDED.value WHERE usage_decay.as_of < EXCLUDED.as_of
"""


async def with_decayed_usage(session: AsyncSession, snapshot: Snapshot, now: datetime, *, fold: bool) -> Snapshot:
    """The snapshot with each tenant's decayed usage where its tree orders by it (`usageHalfLife`); the same
    snapshot, and no query, where no tree does."""
    lives = half_lives(snapshot.tenants, snapshot.cohorts)
    if not lives:
        return snapshot
    values = await decayed_usage(session, lives, now, fold=fold)
    return snapshot.with_tenants(
        dataclasses.replace(view, decayed_usage=values.get(name)) if name in lives else view
        for name, view in snapshot.tenants.items()
    )


async def _from_history(session: AsyncSession, half_lives: Mapping[str, float], now: datetime) -> dict[str, float]:
    """Decayed usage from a tenant's whole history, summed in PostgreSQL (scheduler/quota/usage_decay.py's formula): the raw
    intervals after the rollup's instant, and each rolled-up hour's GPU-seconds spread evenly over its hour."""
    tenants = sorted(half_lives)
    result = dict.fromkeys(tenants, 0.0)
    params = {
        "tenants": tenants,
        "lives": [half_lives[t] for t in tenants],
        "now": now,
        "rolled": await rolled_until(session) or datetime(1970, 1, 1, tzinfo=UTC),
    }
    for sql in (_DECAYED_RAW, _DECAYED_HOURS):
        for tenant, value in await session.execute(text(sql), params):
            result[tenant] += float(value or 0.0)
    return result


_DECAYED_RAW = f"""
SELECT u.tenant, sum(u.gpus * l.h / ln(2.0) * (
           {_WEIGHT.format(age="CAST(:now AS timestamptz) - least(coalesce(u.ended_at, :now), :now)", h="l.h")}
         - {_WEIGHT.format(age="CAST(:now AS timestamptz) - greatest(u.started_at, :rolled)", h="l.h")}))
  FROM usage_intervals AS u
  JOIN unnest(CAST(:tenants AS text[]), CAST(:lives AS float8[])) AS l(tenant, h) ON l.tenant = u.tenant
 WHERE u.kind = 'allocation' AND (u.ended_at IS NULL OR u.ended_at > :rolled) AND u.started_at < :now
 GROUP BY u.tenant
"""
_DECAYED_HOURS = f"""
SELECT u.tenant, sum(u.gpu_seconds / 3600.0 * l.h / ln(2.0) * (
           {_WEIGHT.format(age="CAST(:now AS timestamptz) - (u.hour + interval '1 hour')", h="l.h")}
         - {_WEIGHT.format(age="CAST(:now AS timestamptz) - u.hour", h="l.h")}))
  FROM usage_hourly AS u
  JOIN unnest(CAST(:tenants AS text[]), CAST(:lives AS float8[])) AS l(tenant, h) ON l.tenant = u.tenant
 WHERE u.kind = 'allocation' AND u.hour < :now
 GROUP BY u.tenant
"""


# -- retention ----------------------------------------------------------------------------------------------------

_ROLL_HOURS = """
WITH spans AS (
    SELECT u.kind, u.subject, u.first, u.started_at, u.tenant, coalesce(u.gpu_product, '') AS gpu_product,
           coalesce(u.region, '') AS region, coalesce(u.pool, '') AS pool,
           coalesce(u.priority_class, '') AS priority_class, coalesce(u.shape, '') AS shape, u.gpus, u.nodes,
           h.at AS hour, greatest(u.started_at, h.at) AS s,
           least(coalesce(u.ended_at, :until), :until, h.at + interval '1 hour') AS e
      FROM usage_intervals AS u,
           LATERAL generate_series(date_trunc('hour', greatest(u.started_at, :since), 'UTC'),
                                   least(coalesce(u.ended_at, :until), :until), interval '1 hour') AS h(at)
     WHERE tstzrange(u.started_at, coalesce(u.ended_at, 'infinity'::timestamptz)) && tstzrange(:since, :until)
), keyed AS (
    SELECT * FROM spans WHERE e > s OR (e = s AND started_at = s)
), peaks AS (
    SELECT hour, kind, tenant, gpu_product, region, pool, priority_class, shape, max(held) AS peak FROM (
        SELECT hour, kind, tenant, gpu_product, region, pool, priority_class, shape, delta,
               sum(delta) OVER (PARTITION BY hour, kind, tenant, gpu_product, region, pool, priority_class, shape
                                ORDER BY at, delta ROWS UNBOUNDED PRECEDING) AS held
          FROM (SELECT hour, kind, tenant, gpu_product, region, pool, priority_class, shape, s AS at, gpus AS delta
                  FROM keyed WHERE e > s
                UNION ALL
                SELECT hour, kind, tenant, gpu_product, region, pool, priority_class, shape, e, -gpus
                  FROM keyed WHERE e > s) AS events
    ) AS running WHERE delta > 0
    GROUP BY hour, kind, tenant, gpu_product, region, pool, priority_class, shape
)
INSERT INTO usage_hourly (hour, kind, tenant, gpu_product, region, pool, priority_class, shape, gpu_seconds,
                          node_seconds, allocations, peak_gpus)
SELECT k.hour, k.kind, k.tenant, k.gpu_product, k.region, k.pool, k.priority_class, k.shape,
       sum(k.gpus * extract(epoch FROM k.e - k.s)), sum(k.nodes * extract(epoch FROM k.e - k.s)),
       count(*) FILTER (WHERE k.first AND k.started_at >= k.hour AND k.started_at < k.hour + interval '1 hour'),
       coalesce(max(p.peak), 0)
  FROM keyed AS k
  LEFT JOIN peaks AS p USING (hour, kind, tenant, gpu_product, region, pool, priority_class, shape)
 GROUP BY k.hour, k.kind, k.tenant, k.gpu_product, k.region, k.pool, k.priority_class, k.shape
"""


async def roll_up_step(session: AsyncSession, now: datetime, retention: timedelta, step: timedelta) -> datetime | None:
    """Roll up one step of hours older than the retention, in the caller's transaction: the hourly rows of
    [rolled_until, until), the watermark moved to `until`, and the raw intervals that ended before it deleted, all
    at once (a crash leaves all of it or none). The new watermark, or None when nothing is old enough."""
    limit = _hour(now - retention)
    watermark = (
        await session.execute(text("SELECT rolled_until FROM usage_rollup WHERE id = 1 FOR UPDATE"))
    ).scalar_one_or_none()
    if watermark is None:
        first = (await session.execute(text("SELECT min(started_at) FROM usage_intervals"))).scalar_one_or_none()
        if first is None or _hour(first) >= limit:
            return None
        watermark = _hour(first)
    if watermark >= limit:
        return None
    until = min(limit, watermark + step)
    await session.execute(text(_ROLL_HOURS), {"since": watermark, "until": until})
    await session.execute(text("UPDATE usage_rollup SET rolled_until = :until WHERE id = 1"), {"until": until})
    await session.execute(text("DELETE FROM usage_intervals WHERE ended_at <= :until"), {"until": until})
    return until


def _hour(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


# -- drift --------------------------------------------------------------------------------------------------------


def _expected_sql(since: datetime | None, allocation: str | None) -> str:
    """Each attempt's interval as its claims have it beside the ledger's, where they differ, for the attempts that
    held GPUs at or after `since` (an index scan each side) or of one allocation."""
    claims_where, ledger_where = ["TRUE"], ["TRUE"]
    if since is not None:
        claims_where.append("(claimed_at >= :since OR released_at IS NULL OR released_at >= :since)")
        ledger_where.append(
            "tstzrange(started_at, coalesce(ended_at, 'infinity'::timestamptz)) && "
            "tstzrange(:since, 'infinity'::timestamptz)"
        )
    if allocation is not None:
        claims_where.append("allocation_id = :allocation")
        ledger_where.append("subject = :allocation")
    return f"""
        WITH claims AS (
            SELECT allocation_id, attempt, count(*) AS gpus, min(claimed_at) AS started_at,
                   CASE WHEN bool_and(released_at IS NOT NULL) THEN max(released_at) END AS ended_at
              FROM allocation_resource_claims WHERE {" AND ".join(claims_where)}
             GROUP BY allocation_id, attempt
        ), ledger AS (
            SELECT subject AS allocation_id, attempt, gpus, started_at, ended_at FROM usage_intervals
             WHERE kind = 'allocation' AND {" AND ".join(ledger_where)}
        )
        SELECT coalesce(c.allocation_id, l.allocation_id) AS allocation_id, coalesce(c.attempt, l.attempt) AS attempt,
               c.gpus AS claimed_gpus, c.started_at AS claimed_at, c.ended_at AS released_at,
               l.gpus AS ledger_gpus, l.started_at AS ledger_start, l.ended_at AS ledger_end
          FROM claims AS c FULL JOIN ledger AS l ON l.allocation_id = c.allocation_id AND l.attempt = c.attempt
         WHERE (c.allocation_id IS NULL AND (CAST(:rolled AS timestamptz) IS NULL OR l.ended_at IS NULL
                                             OR l.ended_at > :rolled))
            OR (l.allocation_id IS NULL AND (CAST(:rolled AS timestamptz) IS NULL OR c.ended_at IS NULL
                                             OR c.ended_at > :rolled))
            OR c.gpus <> l.gpus OR c.started_at <> l.started_at OR c.ended_at IS DISTINCT FROM l.ended_at
         ORDER BY 1, 2
    """


@dataclass(frozen=True)
class Drift:
    allocation_id: str
    attempt: int
    message: str


async def drift(session: AsyncSession, since: datetime | None = None, allocation: str | None = None) -> list[Drift]:
    """Where the ledger and the claims disagree: an attempt's interval missing, one the claims do not have, or one
    whose GPUs, start or end differ. `since`: only attempts that held GPUs then or after (the reconciler looks at
    the last day each minute; None: all of them). Rolled-up history is not compared."""
    rolled = await rolled_until(session)
    found = []
    params = {"since": since, "allocation": allocation, "rolled": rolled}
    for row in await session.execute(text(_expected_sql(since, allocation)), params):
        found.append(Drift(row.allocation_id, row.attempt, _describe(row)))
    return found


def _describe(row: Any) -> str:
    where = f"allocation {row.allocation_id} attempt {row.attempt}"
    if row.ledger_gpus is None:
        return f"{where} held {row.claimed_gpus} GPU(s) from {row.claimed_at:%Y-%m-%dT%H:%M:%SZ}, but the usage ledger has no interval for it"
    if row.claimed_gpus is None:
        return f"the usage ledger bills {where} for {row.ledger_gpus} GPU(s), but it has no claims"
    return (
        f"the usage ledger has {where} as {row.ledger_gpus} GPU(s) from {row.ledger_start} to {row.ledger_end or 'now'};"
        f" its claims say {row.claimed_gpus} GPU(s) from {row.claimed_at} to {row.released_at or 'now'}"
    )


async def repair(session: AsyncSession, allocation_id: str) -> int:
    """Rebuild the allocation's ledger from its claims (re-read here, under the allocation's row lock), then count
    the totals again from the ledger: how many intervals changed."""
    await session.execute(text("SELECT 1 FROM allocations WHERE id = :id FOR UPDATE"), {"id": allocation_id})
    wrong = await drift(session, None, allocation_id)
    for found in wrong:
        await session.execute(
            text("DELETE FROM usage_intervals WHERE kind = 'allocation' AND subject = :id AND attempt = :attempt"),
            {"id": allocation_id, "attempt": found.attempt},
        )
        await session.execute(text(_REBUILD), {"id": allocation_id, "attempt": found.attempt})
    if wrong:
        await recount_totals(session)
    return len(wrong)


async def recount_totals(session: AsyncSession) -> None:
    """The closed intervals' totals counted again from the ledger: every rolled-up hour, the raw closed intervals'
    parts after the rollup's instant, less the parts of still open ones that the hours already hold. Under a lock
    on the rollup's row, so no rollup moves the instant meanwhile."""
    rolled = (
        await session.execute(text("SELECT rolled_until FROM usage_rollup WHERE id = 1 FOR UPDATE"))
    ).scalar_one_or_none()
    await session.execute(text("LOCK TABLE usage_totals IN EXCLUSIVE MODE"))
    await session.execute(text("DELETE FROM usage_totals"))
    await session.execute(text(_RECOUNT), {"rolled": rolled})


_RECOUNT = """
INSERT INTO usage_totals (kind, tenant, gpu_product, region, gpu_seconds, node_seconds)
SELECT kind, tenant, gpu_product, region, sum(g), sum(n) FROM (
    SELECT kind, tenant, gpu_product, region, gpu_seconds AS g, node_seconds AS n
      FROM usage_hourly WHERE kind <> 'reservation'
    UNION ALL
    SELECT kind, tenant, coalesce(gpu_product, ''), coalesce(region, ''),
           gpus * extract(epoch FROM ended_at - greatest(started_at, CAST(:rolled AS timestamptz))),
           nodes * extract(epoch FROM ended_at - greatest(started_at, CAST(:rolled AS timestamptz)))
      FROM usage_intervals WHERE kind <> 'reservation' AND ended_at IS NOT NULL
    UNION ALL
    SELECT kind, tenant, coalesce(gpu_product, ''), coalesce(region, ''),
           -gpus * extract(epoch FROM CAST(:rolled AS timestamptz) - started_at),
           -nodes * extract(epoch FROM CAST(:rolled AS timestamptz) - started_at)
      FROM usage_intervals
     WHERE kind <> 'reservation' AND ended_at IS NULL AND started_at < CAST(:rolled AS timestamptz)
) AS parts GROUP BY kind, tenant, gpu_product, region
"""


_REBUILD = """
INSERT INTO usage_intervals (kind, subject, attempt, tenant, gpu_product, region, pool, priority_class, shape,
                             node_id, gpus, started_at, ended_at, end_reason, first)
SELECT 'allocation', k.allocation_id, k.attempt, a.tenant, coalesce(p.gpu_product, a.gpu_product),
       coalesce(c.region, a.region), p.cluster || '/' || p.name, a.request->>'priority_class', a.shape, k.node_id,
       k.gpus, k.claimed_at, k.released_at, CASE WHEN k.released_at IS NOT NULL THEN usage_end_reason(a.id) END,
       k.attempt = (SELECT min(y.attempt) FROM allocation_resource_claims AS y WHERE y.allocation_id = a.id)
  FROM (SELECT allocation_id, attempt, min(node_id) AS node_id, count(*) AS gpus, min(claimed_at) AS claimed_at,
               CASE WHEN bool_and(released_at IS NOT NULL) THEN max(released_at) END AS released_at
          FROM allocation_resource_claims WHERE allocation_id = :id AND attempt = :attempt
         GROUP BY allocation_id, attempt) AS k
  JOIN allocations AS a ON a.id = k.allocation_id
  LEFT JOIN nodes AS nd ON nd.name = k.node_id
  LEFT JOIN pools AS p ON p.id = nd.pool_id
  LEFT JOIN clusters AS c ON c.name = p.cluster
"""

__all__ = [
    "DEFAULT_RETENTION",
    "GROUPINGS",
    "Drift",
    "UsageQuery",
    "UsageRow",
    "counted_until",
    "decayed_usage",
    "drift",
    "fleet_gpus",
    "gpu_seconds_totals",
    "recount_totals",
    "repair",
    "report",
    "roll_up_step",
    "rolled_until",
    "with_decayed_usage",
]
