"""Usage: GPU-hours by tenant or product over time, a stacked bar per hour or day (console/svg.py), the numbers
`berth usage` prints for the same window under it, each tenant's share of the fleet and its standing in fair sharing
(what the admission pass orders by), and the same report as CSV (`/console/usage.csv`, `berth usage -o csv`'s
columns: contracts/usage.py writes both).

Every number is `GET /v1/usage` as the visitor's bearer reads it (a tenant its own), asked with the parameters
`berth usage` sends: `from`, `to`, `by`, `bucket`. The page's totals and its chart are asked for one and the same
window: the totals' answer fixes `to` (now, when none is given) and the chart asks for exactly that.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Annotated

from fastapi import Query, Request
from fastapi.responses import Response

import berth
from console import svg
from console.web import SignedIn, page, router
from contracts.http import UsageReport
from contracts.usage import csv_text

STACKS = ("tenant", "product")
BUCKETS = ("day", "hour")
MOST_SERIES = 7  # the largest few, then "other": eight colours and patterns stay apart
Text = Annotated[str | None, Query(max_length=64)]


class BadInstant(ValueError):
    pass


EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def instant(value: str | None, name: str) -> datetime | None:
    """`2026-11-01T00:00:00Z`, `2026-11-01T00:00` (UTC) or a date `2026-11-01` (midnight UTC), as `berth usage`
    reads them; None for nothing."""
    if not value or not value.strip():
        return None
    text = value.strip()
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            at = datetime(day.year, day.month, day.day, tzinfo=UTC)
        else:
            at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadInstant(f"{name}: {text!r} is not a date (2026-11-01) or a time (2026-11-01T09:00Z)") from None
    at = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    if not EARLIEST <= at <= LATEST:  # room for a window's width around it: no arithmetic on it can overflow
        raise BadInstant(f"{name}: {text!r} is outside the years {EARLIEST.year} to {LATEST.year}")
    return at


def _step(bucket: str) -> timedelta:
    return timedelta(hours=1) if bucket == "hour" else timedelta(days=1)


def chart_of(report: UsageReport, stack: str) -> tuple[list[str], list[svg.Series], list[datetime]]:
    """The bucketed report as bar labels and series (the largest MOST_SERIES, then "other"), every bucket of the
    window present (an hour or a day with no usage is a bar of zero)."""
    assert report.bucket is not None
    step = _step(report.bucket)
    first = report.start.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    if report.bucket == "day":
        first = first.replace(hour=0)
    buckets: set[datetime] = {row.bucket for row in report.rows if row.bucket is not None}
    at = first
    while at < report.end and len(buckets) < 5000:
        buckets.add(at)
        at += step
    ordered = sorted(buckets)
    index = {at: i for i, at in enumerate(ordered)}
    by_name: dict[str, list[float]] = {}
    for row in report.rows:
        name = str(row.model_dump(by_alias=True).get(stack) or "(none)")
        values = by_name.setdefault(name, [0.0] * len(ordered))
        if row.bucket is not None:
            values[index[row.bucket]] += row.gpu_hours
    ranked = sorted(by_name, key=lambda name: (-sum(by_name[name]), name))
    series = [svg.Series(name, by_name[name]) for name in ranked[:MOST_SERIES]]
    if len(ranked) > MOST_SERIES:
        rest = [sum(by_name[name][i] for name in ranked[MOST_SERIES:]) for i in range(len(ordered))]
        series.append(svg.Series(f"{svg.OTHER} ({len(ranked) - MOST_SERIES})", rest))
    shown = "%m-%d %H:00" if report.bucket == "hour" else "%Y-%m-%d"
    return [at.strftime(shown) for at in ordered], series, ordered


@router.get("/usage")
async def usage(
    request: Request,
    visitor: SignedIn,
    start: Annotated[str | None, Query(alias="from", max_length=64)] = None,
    end: Annotated[str | None, Query(alias="to", max_length=64)] = None,
    by: Text = None,
    bucket: Text = None,
) -> Response:
    stack = by if by in STACKS else "tenant"
    step = bucket if bucket in BUCKETS else "day"
    chosen = {"from": start or "", "to": end or "", "by": stack, "bucket": step}
    problem = None
    totals = chart = tenants = None
    try:
        since, until = instant(start, "From"), instant(end, "To")
        totals = await visitor.api.usage(start=since, end=until, by=stack)
        chart = await visitor.api.usage(start=totals.start, end=totals.end, by=stack, bucket=step)
        tenants = totals if stack == "tenant" else await visitor.api.usage(start=totals.start, end=totals.end)
    except BadInstant as error:
        problem = str(error)
    except (berth.InvalidRequest, berth.Forbidden) as error:
        problem = error.message
    drawn = None
    if chart is not None and totals is not None:
        labels, series, _ = chart_of(chart, stack)
        window = f"{totals.start:%Y-%m-%d %H:%M}Z to {totals.end:%Y-%m-%d %H:%M}Z"
        drawn = {
            "svg": svg.stacked_bars(
                "usage-chart",
                f"GPU-hours by {stack}, per {step}, {window}",
                f"A stacked bar per {step}; each layer is one {stack}'s GPU-hours in it. "
                f"The totals by {stack} are in the table below the chart.",
                labels,
                series,
                "GPU-hours",
            ),
            "series": series,
            "labels": labels,
        }
    return page(
        request,
        visitor,
        "usage.html",
        chosen=chosen,
        stacks=STACKS,
        buckets=BUCKETS,
        problem=problem,
        totals=totals,
        tenants=tenants,
        drawn=drawn,
        swatch=svg.legend_swatch,
        query=request.url.query,
    )


@router.get("/usage.csv")
async def usage_csv(
    request: Request,
    visitor: SignedIn,
    start: Annotated[str | None, Query(alias="from", max_length=64)] = None,
    end: Annotated[str | None, Query(alias="to", max_length=64)] = None,
    by: Annotated[str, Query(max_length=200)] = "tenant",
    bucket: Text = None,
) -> Response:
    """The report as `berth usage -o csv` writes it for the same `from`, `to`, `by` and `bucket`."""
    try:
        report = await visitor.api.usage(
            start=instant(start, "from"), end=instant(end, "to"), by=by, bucket=bucket or None
        )
    except BadInstant as error:
        return Response(f"{error}\n", status_code=422, media_type="text/plain; charset=utf-8")
    except (berth.InvalidRequest, berth.Forbidden) as error:
        status = 403 if isinstance(error, berth.Forbidden) else 422
        return Response(f"{error.message}\n", status_code=status, media_type="text/plain; charset=utf-8")
    name = f"usage-{report.start:%Y%m%dT%H%M}-{report.end:%Y%m%dT%H%M}.csv"
    return Response(
        csv_text(report),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )
