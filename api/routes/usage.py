"""`GET /v1/usage`: what each tenant used, from the usage ledger (store/usage.py has what starts and ends a billed
interval): GPU-hours exact to the second, allocations, peak concurrent GPUs and share of the fleet, grouped by
tenant, product, region, pool, PriorityClass or shape, optionally per hour or day for a chart (sreport's shape).

A tenant token reads its own usage only; an admin every tenant's (or one, with `tenant`). Beside the rows, each of
those tenants' standing in fair sharing now (weight, share, decayed usage: what the admission pass orders by).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query

from api import queue_view
from api.auth import Viewer
from api.errors import ApiError, error_responses
from api.request_checks import fleet_for
from api.services import Services, services
from contracts.http import UsageGroup, UsageReport
from contracts.manifest import Name
from contracts.usage import GROUPINGS, parse_grouping
from store import usage

router = APIRouter(prefix="/v1/usage", tags=["usage"])
App = Annotated[Services, Depends(services)]

DEFAULT_WINDOW = timedelta(days=30)
# One row per group and bucket: an hourly chart over more than this many hours is refused, not truncated.
MOST_BUCKETS = {"hour": 24 * 93, "day": 3660}


def grouping(by: str, field: str) -> tuple[str, ...]:
    """The groupings `by` names; a 422 naming the field otherwise."""
    try:
        return parse_grouping(by)
    except ValueError as error:
        raise ApiError(
            422, "unknown_grouping", str(error), [{"field": field, "value": by, "choices": list(GROUPINGS)}]
        ) from None


def window(start: datetime | None, end: datetime | None, now: datetime) -> tuple[datetime, datetime]:
    """[from, to): `to` defaults to now, `from` to 30 days before `to`; a `from` not before `to` is a 422."""
    for name, value in (("from", start), ("to", end)):
        if value is not None and value.tzinfo is None:
            raise ApiError(
                422,
                "invalid_window",
                f"`{name}` needs a UTC offset (2026-11-01T00:00:00Z)",
                [{"field": f"query.{name}", "value": value.isoformat()}],
            )
    end = end or now
    start = start or end - DEFAULT_WINDOW
    if start >= end:
        raise ApiError(
            422,
            "invalid_window",
            f"`from` ({start.isoformat()}) is not before `to` ({end.isoformat()})",
            [{"field": "query.from", "value": start.isoformat()}],
        )
    return start, end


@router.get("", response_model=UsageReport, response_model_by_alias=True, responses=error_responses(401, 403, 422))
async def usage_report(
    caller: Viewer,
    app: App,
    start: Annotated[datetime | None, Query(alias="from", description="RFC 3339; default 30 days before `to`.")] = None,
    end: Annotated[datetime | None, Query(alias="to", description="RFC 3339; default (and at most) now.")] = None,
    by: Annotated[
        str, Query(max_length=200, description="Comma-separated: tenant, product, region, pool, class, shape.")
    ] = "tenant",
    bucket: Annotated[Literal["hour", "day"] | None, Query(description="One row per hour or day, for a chart.")] = None,
    tenant: Annotated[Name | None, Query(description="Only this tenant's (one the caller belongs to).")] = None,
) -> UsageReport:
    """GPU-hours, allocations, peak concurrent GPUs and share of the fleet per group in [from, to)."""
    now = datetime.now(UTC)
    names = grouping(by, "query.by")
    start, end = window(start, end, now)
    if tenant is not None and not caller.may_see(tenant):
        raise ApiError(403, "forbidden", f"{caller.actor} cannot read tenant {tenant!r}'s usage")
    if bucket is not None and (min(end, now) - start) / timedelta(**{f"{bucket}s": 1}) > MOST_BUCKETS[bucket]:
        raise ApiError(
            422,
            "too_many_buckets",
            f"at most {MOST_BUCKETS[bucket]} {bucket}s per report: narrow the window or choose a larger bucket",
            [{"field": "query.bucket", "value": bucket}],
        )
    tenants = frozenset({tenant}) if tenant is not None else caller.visible
    query = usage.UsageQuery(start, end, names, tenants=tenants, bucket=bucket)
    async with app.sessions() as session:
        rows = await usage.report(session, query, now)
        regions = None
        if not caller.sees_all:  # a tenant's share is of the regions it may use
            regions = sorted(fleet_for((await app.inventory.inventory(session)).snapshot, caller).regions)
        gpus = await usage.fleet_gpus(session, regions)
        rolled = await usage.rolled_until(session)
        standing = await queue_view.standings(session, app.inventory, tenants)
    report = usage_response(query, rows, gpus, rolled, min(end, now))
    report.fair_shares = standing
    return report


def usage_response(
    query: usage.UsageQuery, rows: list[usage.UsageRow], gpus: int, rolled: datetime | None, end: datetime
) -> UsageReport:
    """The report as the API and the CLI show it: hours, and each row's share of the fleet over its window."""
    groups = []
    for row in rows:
        span = (end - query.start).total_seconds()
        if row.bucket is not None:
            bucket_end = row.bucket + (timedelta(hours=1) if query.bucket == "hour" else timedelta(days=1))
            span = (min(bucket_end, end) - max(row.bucket, query.start)).total_seconds()
        share = row.gpu_seconds / (gpus * span) if gpus and span > 0 else None
        groups.append(
            UsageGroup(
                tenant=row.group.get("tenant"),
                product=row.group.get("product"),
                region=row.group.get("region"),
                pool=row.group.get("pool"),
                priority_class=row.group.get("class"),
                shape=row.group.get("shape"),
                bucket=row.bucket,
                gpu_hours=round(row.gpu_seconds / 3600, 6),
                node_hours=round(row.node_seconds / 3600, 6),
                reserved_gpu_hours=round(row.reserved_gpu_seconds / 3600, 6),
                allocations=row.allocations,
                peak_gpus=row.peak_gpus,
                share_of_fleet=round(share, 6) if share is not None else None,
            )
        )
    return UsageReport(
        start=query.start,
        end=end,
        by=list(query.by),
        bucket=query.bucket,
        fleet_gpus=gpus,
        rolled_up_before=rolled,
        rows=groups,
    )
