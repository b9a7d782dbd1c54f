"""The console in a real browser (Debian's Chromium, driven by Playwright) against a live stack: the real API and
its console over HTTP, a control worker and simulated node agents on the lab fleet (tests/api/stack.py), people
signing in through the test OIDC provider's own page. One stack and one browser for the module; each person has a
browser profile (cookies) of their own.

What is asserted: each page shows what the API answers; a tenant's session never receives another tenant's
allocation id (every response body the page received is searched); a release clicked in the console ends the
allocation and its trail names the person who clicked; a viewer is offered no action and a forced one is the API's
403; CSRF and foreign origins are refused; the navigation and an action are reached with Tab; no state is told by
colour alone. With BERTH_SCREENSHOTS=1 each page's picture is saved for docs/operating.md.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import quote, urlencode

import pytest
from playwright.async_api import Browser, BrowserContext, Page, expect
from typer.testing import CliRunner

import berth
from cli.main import app as cli
from tests.api.served import Served
from tests.console.browsing import (
    TEMPORAL_UI,
    WAIT_MS,
    Received,
    colourless,
    focused,
    new_page,
    screenshot,
    sign_in_person,
    sign_in_token,
    tab_stops,
)
from tests.identity.provider import Provider

# One worker takes the whole module (loadgroup), so its one stack and one browser are started once.
pytestmark = [pytest.mark.console, pytest.mark.xdist_group("console")]

SECTIONS = ["Fleet", "Queues", "Allocations", "Usage", "Reservations", "Health"]


@dataclass
class Seeded:
    """What the module's stack holds before any test: acme's 2-GPU allocation, active on `small`, and globex's
    1-GPU allocation, placed on `slow` (which never boots, so it stays there)."""

    acme: str
    globex: str
    admin: berth.AsyncClient


@pytest.fixture(scope="module")
async def seeded(live: Served) -> AsyncIterator[Seeded]:
    admin = berth.AsyncClient(live.base_url, live.admin_token)
    acme = berth.AsyncClient(live.base_url, live.tenant_tokens["acme"])
    globex = berth.AsyncClient(live.base_url, live.tenant_tokens["globex"])
    try:
        ours = (await acme.allocations.create(gpus=2)).id
        theirs = (await globex.allocations.create(gpus=1)).id
        await admin.allocations.wait(ours, "active", timeout=60)
        await admin.allocations.wait(theirs, "waiting_ready", timeout=60)
        yield Seeded(ours, theirs, admin)
    finally:
        for client in (admin, acme, globex):
            await client.aclose()


async def still_active(seeded: Seeded, allocation_id: str) -> None:
    """Nothing changed: the allocation is active and nobody asked for its release or cancellation."""
    shown = await seeded.admin.allocations.get(allocation_id)
    assert shown.state == "active", shown
    assert not [e for e in shown.events if e.step in ("release_requested", "cancel_requested")], shown.events


async def test_the_admin_signs_in_with_a_token_and_sees_every_allocation(
    browser: Browser, live: Served, seeded: Seeded
) -> None:
    _, login = await new_page(browser, live.base_url)
    await login.goto("/console/allocations")
    await expect(login.get_by_role("heading", name="Sign in to Berth")).to_be_visible()
    await screenshot(login, "login")

    page = await sign_in_token(browser, live.base_url, live.admin_token)
    rows = page.locator("table tbody tr")
    await expect(rows.filter(has_text=seeded.acme)).to_contain_text("acme")
    await expect(rows.filter(has_text=seeded.acme)).to_contain_text("active")
    await expect(rows.filter(has_text=seeded.globex)).to_contain_text("globex")
    assert await colourless(page) == []
    await screenshot(page, "allocations")

    await page.get_by_role("link", name=seeded.acme).click()
    await expect(page.get_by_role("heading", name=f"Allocation {seeded.acme}")).to_be_visible()
    await expect(page.locator("dd.state").first).to_contain_text("active")
    shown = await seeded.admin.allocations.get(seeded.acme)
    await expect(page.locator("dl.facts")).to_contain_text("small")
    timeline = page.locator("table").first
    for event in shown.events:  # the trail, as the API tells it
        await expect(timeline).to_contain_text(event.step)
    link = page.get_by_role("link", name="Its workflow in the Temporal UI")
    workflow = quote(shown.workflow_id, safe="")
    await expect(link).to_have_attribute("href", f"{TEMPORAL_UI}/namespaces/default/workflows/{workflow}")
    assert await colourless(page) == []
    await screenshot(page, "allocation")

    # The filter narrows the list to what the API answers for it.
    await page.goto("/console/allocations")
    await page.get_by_label("State").select_option("waiting_ready")
    await page.get_by_role("button", name="Filter").click()
    await expect(page.locator("table tbody")).to_contain_text(seeded.globex)
    await expect(page.locator("table tbody")).not_to_contain_text(seeded.acme)


async def test_a_tenant_never_receives_another_tenants_allocation(
    browser: Browser, live: Served, oidc_provider: Provider, seeded: Seeded
) -> None:
    context, page = await sign_in_person(browser, live.base_url, oidc_provider, "alice@example.com", "acme-ml")
    received = Received()
    page.on("response", received.keep)
    await page.clock.install()  # the live parts' timers, moved on by the test instead of waited for
    await page.goto("/console/allocations")
    await expect(page.locator("table tbody")).to_contain_text(seeded.acme)
    await page.clock.run_for(10_000)
    await expect(page.locator("[data-live][data-updated]")).to_have_count(1)  # a live refresh came back
    await page.goto("/console/allocations?tenant=globex")  # asking for it by name
    await page.goto("/console/allocations?node=slow")  # where globex's allocation is
    await page.goto(f"/console/allocations/{seeded.acme}")
    await page.clock.run_for(10_000)
    await expect(page.locator("[data-live][data-updated]")).to_have_count(1)
    for section in SECTIONS:  # every page the navigation offers, as each lands
        await page.goto(f"/console/{section.lower()}")
    await page.wait_for_load_state("networkidle")
    assert len(received.bodies) > 8
    assert received.mentioning(seeded.acme), "the page never showed acme's own allocation"
    assert received.mentioning(seeded.globex) == []

    # Its page by id: the same 404 as an id that does not exist, so not even its existence is told.
    theirs = await page.goto(f"/console/allocations/{seeded.globex}")
    nobodys = await page.goto("/console/allocations/no-such-allocation")
    assert theirs is not None and nobodys is not None
    assert (theirs.status, nobodys.status) == (404, 404)
    await context.close()


async def test_a_release_clicked_in_the_console_ends_it_and_names_who_clicked(
    browser: Browser, live: Served, oidc_provider: Provider, seeded: Seeded
) -> None:
    acme = berth.AsyncClient(live.base_url, live.tenant_tokens["acme"])
    try:
        allocation = (await acme.allocations.create(gpus=2)).id  # on `big`: acme's first holds `small`
    finally:
        await acme.aclose()
    await seeded.admin.allocations.wait(allocation, "active", timeout=60)
    context, page = await sign_in_person(
        browser, live.base_url, oidc_provider, "bob@example.com", "acme-ml", start=f"/console/allocations/{allocation}"
    )
    await page.get_by_role("link", name="Release").click()
    await expect(page.get_by_role("heading", name=f"Release allocation {allocation}?")).to_be_visible()
    await screenshot(page, "allocation_confirm")
    await page.get_by_role("button", name="Yes, release it").click()
    await expect(page.get_by_role("status")).to_contain_text("Asked: release")

    ended = await seeded.admin.allocations.wait(allocation, "released", timeout=60)
    asked = [(e.step, e.actor) for e in ended.events if e.actor]
    assert ("release_requested", "bob@example.com") in asked, ended.events
    await expect(page.locator("dd.state").first).to_contain_text("releas", timeout=WAIT_MS)  # live, or on reload
    await context.close()


async def test_a_viewer_is_offered_no_action_and_a_forced_one_is_the_apis_403(
    browser: Browser, live: Served, oidc_provider: Provider, seeded: Seeded
) -> None:
    context, page = await sign_in_person(
        browser,
        live.base_url,
        oidc_provider,
        "victor@example.com",
        "acme-watchers",
        start=f"/console/allocations/{seeded.acme}",
    )
    await expect(page.locator("dd.state").first).to_contain_text("active")
    await expect(page.locator(".who")).to_contain_text("viewer")
    for action in ("Release", "Cancel", "Extend", "Retry"):
        await expect(page.get_by_role("link", name=action, exact=True)).to_have_count(0)
    await expect(page.get_by_role("heading", name="Actions")).to_have_count(0)

    # Forced: the confirmation page opened by its address, and its form (this session's own CSRF token) posted.
    await page.goto(f"/console/allocations/{seeded.acme}/release")
    await page.get_by_role("button", name="Yes, release it").click()
    await expect(page.get_by_role("alert")).to_contain_text("The API refused it")
    await expect(page.get_by_role("alert")).to_contain_text("forbidden")
    await still_active(seeded, seeded.acme)
    await context.close()


async def _csrf_of(page: Page, allocation_id: str) -> str:
    await page.goto(f"/console/allocations/{allocation_id}/release")
    return await page.locator("#main input[name=csrf]").get_attribute("value") or ""


async def test_an_action_without_this_sessions_csrf_token_or_from_another_site_is_refused(
    browser: Browser, live: Served, oidc_provider: Provider, seeded: Seeded
) -> None:
    context, page = await sign_in_person(browser, live.base_url, oidc_provider, "carol@example.com", "acme-ml")
    other = await sign_in_token(browser, live.base_url, live.tenant_tokens["acme"])
    own, foreign = await _csrf_of(page, seeded.acme), await _csrf_of(other, seeded.acme)
    assert own and foreign and own != foreign
    action = f"/console/allocations/{seeded.acme}/release"

    async def post(context: BrowserContext, form: dict[str, str], **headers: str) -> int:
        answer = await context.request.post(action, form=form, headers=headers, max_redirects=0)
        return answer.status

    assert await post(context, {}) == 403  # no token
    assert await post(context, {"csrf": foreign}) == 403  # another session's
    assert await post(context, {"csrf": "0" * 64}) == 403  # made up
    assert await post(context, {"csrf": own}, Origin="http://elsewhere.example") == 403  # the right one, off-site
    await still_active(seeded, seeded.acme)

    # Signing in from another site's form is refused too: no session is opened.
    login = await context.request.post(
        "/console/login/token",
        form={"token": live.tenant_tokens["acme"]},
        headers={"Origin": "http://elsewhere.example"},
        max_redirects=0,
    )
    assert login.status != 303 and "set-cookie" not in login.headers
    await context.close()
    await other.context.close()


async def test_the_navigation_and_an_action_are_reached_with_the_keyboard(
    browser: Browser, live: Served, oidc_provider: Provider, seeded: Seeded
) -> None:
    context, page = await sign_in_person(
        browser,
        live.base_url,
        oidc_provider,
        "dave@example.com",
        "acme-ml",
        start=f"/console/allocations/{seeded.acme}",
    )
    reached = await tab_stops(page)
    assert [s for s in SECTIONS if s in reached] == SECTIONS, reached
    assert "Release" in reached, reached
    assert reached.index("Allocations") < reached.index("Release")  # in reading order: the navigation first

    # Tab to Release, Enter: the confirmation, whose button Tab reaches next.
    await page.reload()
    for _ in range(reached.index("Release") + 1):
        await page.keyboard.press("Tab")
    assert await focused(page) == "Release"
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("heading", name=f"Release allocation {seeded.acme}?")).to_be_visible()
    assert "Yes, release it" in await tab_stops(page)
    assert await colourless(page) == []
    await context.close()


# Each section's page, as the admin sees it: (path, what it must say once drawn, the picture's name).
PAGES = [
    ("/console/fleet", "slices", "fleet"),
    ("/console/nodes/small", "Allocations on it", "node"),
    ("/console/queues", "Queues", "queues"),
    ("/console/usage", "Totals by tenant", "usage"),
    ("/console/reservations", "Reservations", "reservations"),
    ("/console/health", "Health", "health"),
]


async def test_each_section_shows_the_stack_with_words_not_colour_alone(
    browser: Browser, live: Served, seeded: Seeded
) -> None:
    page = await sign_in_token(browser, live.base_url, live.admin_token, start="/console/fleet")
    for path, says, picture in PAGES:
        answer = await page.goto(path)
        assert answer is not None and answer.status == 200, (path, answer and await answer.text())
        await expect(page.locator("main")).to_contain_text(says)
        await expect(page.locator("nav a[aria-current=page]")).to_have_count(0 if "/nodes/" in path else 1)
        assert await colourless(page) == [], path
        await screenshot(page, picture)
    # The node where acme's allocation runs shows each GPU it holds, in words, linking to it.
    await page.goto("/console/nodes/small")
    held = page.locator(f"a.gpu[href='/console/allocations/{seeded.acme}']")
    await expect(held.first).to_have_attribute("aria-label", re.compile(f"by allocation {seeded.acme}"))
    assert await held.count() >= 2  # two GPUs, each a cell with its letter and its words (the table repeats them)
    await expect(held.first).not_to_have_text("")


async def test_the_usage_charts_totals_are_berth_usage_for_the_same_window(
    browser: Browser, live: Served, seeded: Seeded
) -> None:
    deadline = time.monotonic() + 30
    while True:  # until the ledger counts acme's running allocation: its open interval counts up to a moment ago
        end = datetime.now(UTC).replace(microsecond=0)  # past by the time either asks: both read the same hours
        start = end - timedelta(hours=3)
        since, until = (t.strftime("%Y-%m-%dT%H:%M:%SZ") for t in (start, end))
        ran = CliRunner().invoke(
            cli, ["usage", "--from", since, "--to", until, "--by", "tenant", "-o", "json"], env=live.admin_env()
        )
        assert ran.exit_code == 0, ran.output
        expected = {row["tenant"]: row["gpu_hours"] for row in json.loads(ran.stdout)["rows"]}
        if expected.get("acme", 0) > 0:
            break
        assert time.monotonic() < deadline, f"acme's allocation never showed in berth usage: {expected}"
        await asyncio.sleep(0.5)

    page = await sign_in_token(browser, live.base_url, live.admin_token, start="/console/usage")
    await page.goto(f"/console/usage?{urlencode({'from': since, 'to': until, 'by': 'tenant', 'bucket': 'hour'})}")
    await expect(page.get_by_role("img", name=re.compile("GPU-hours by tenant, per hour"))).to_be_visible()
    await page.get_by_text("The chart's numbers").click()  # its numbers, as text, under the chart
    chart = page.locator("figure.usage-chart + details table")
    names = [n.strip() for n in await chart.locator("thead th").all_inner_texts()][1:]
    rows = [
        [float(v.replace(",", "")) for v in await row.locator("td").all_inner_texts()]
        for row in await chart.locator("tbody tr").all()
    ]
    drawn = {name: sum(row[i] for row in rows) for i, name in enumerate(names)}
    assert set(drawn) == set(expected), (drawn, expected)
    for tenant, hours in expected.items():  # each bar's layer is shown to 2 decimals: at most half a cent off each
        assert abs(drawn[tenant] - hours) <= 0.005 * len(rows) + 1e-9, (tenant, drawn, expected)
    totals = page.locator("table[aria-labelledby=totals-h] td[data-gpu-hours]")
    shown = [float(v or 0) for v in [await t.get_attribute("data-gpu-hours") for t in await totals.all()]]
    assert sorted(shown) == sorted(expected.values())
