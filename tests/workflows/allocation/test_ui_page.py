"""The allocation's page in the Temporal UI, opened in a real browser (Debian's Chromium, driven by Playwright) from
the link Berth prints: the timeline names each placement step and its node, Current Details says the state, the
bundles and the attempts, and a hold handed over to a fresh run says which run it continues. The list filtered by
`BerthState="active"` shows each allocation once.

The session's Temporal fixture serves no UI, so this test starts its own dev server with the UI (as `berth up`
does), on free loopback ports.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from config.context import StackContext
from devstack.process import stop
from devstack.temporal import DevTemporal
from tests.workflows.allocation.test_one_story import until_active
from tests.workflows.lab import lab_fleet, running_lab
from workflows.allocation import client as allocation_client
from workflows.allocation.messages import HandOverRequest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

# As the machine's own check starts it: no sandbox as root, and nothing that reaches past loopback.
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 30_000


@pytest.fixture
async def ui_server(tmp_path: Path) -> AsyncIterator[DevTemporal]:
    server = await asyncio.to_thread(DevTemporal(tmp_path / "temporal").start)
    try:
        yield server
    finally:  # a throwaway server: no need for the graceful stop's wait for its clients
        await asyncio.to_thread(stop, server.process, timeout=2.0)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    """Debian's chromium. Where the README's test command can install it (root, apt: as CI runs) its absence is a
    failure; elsewhere the test skips, saying so in one loud line."""
    if CHROMIUM is None:
        if os.geteuid() == 0 and shutil.which("apt-get") is not None:
            pytest.fail(
                "chromium is missing although this machine can install it (root, apt): run the README's test "
                "command, whose first step scripts/test-prerequisites.sh installs it",
                pytrace=False,
            )
        pytest.skip(
            "LOUD: chromium is missing and this machine cannot install it (not root or no apt): the Temporal "
            "UI browser test did NOT run"
        )
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield launched
        finally:
            await launched.close()


async def open_tab(page: Page, name: str) -> None:
    await page.get_by_text(name, exact=True).first.click()


async def details_say(page: Page, text: str) -> None:
    """Wait until Current Details (markdown the UI renders in a sandboxed frame of its own) shows `text`."""
    for _ in range(WAIT_MS // 100):
        for frame in page.frames:
            if text in await frame.evaluate("document.body ? document.body.innerText : ''"):
                return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the page's details never said {text!r}")


async def test_the_page_from_berths_link_tells_the_allocations_whole_story(
    ui_server: DevTemporal, browser: Browser, sessions, tmp_path: Path
) -> None:
    client = await Client.connect(ui_server.address, data_converter=pydantic_data_converter)
    context = StackContext(temporal_address=ui_server.address, temporal_ui_url=ui_server.ui_url, database_url="-")
    fleet = lab_fleet({"one": {"gpus": 2}, "two": {"gpus": 2}})
    async with running_lab(client, client, sessions, tmp_path / "lab", fleet) as lab:
        stays, moves = await lab.allocate("ui-stays", gpus=2), await lab.allocate("ui-moves", gpus=2)
        placed = {name: await until_active(client, name, every=0.1) for name in ("ui-stays", "ui-moves")}
        await client.get_workflow_handle(moves.id).signal("hand_over", HandOverRequest(reason="upgrade"))
        for _ in range(100):  # the hold goes on in a fresh run; the first is left to its story
            if (await client.get_workflow_handle(moves.id).describe()).run_id != moves.result_run_id:
                break
            await asyncio.sleep(0.05)

        page = await browser.new_page(viewport={"width": 1600, "height": 2000})
        link = context.workflow_link(stays.id)
        assert link is not None
        await page.goto(link)
        node = placed["ui-stays"].node
        # The lab's hosts make VMs ready the moment they exist: the create's line says it took the readiness look too.
        for step in ("choose_placement", f"plan_bundles on {node}", f"create_vm + wait_ready on {node}"):
            await page.get_by_text(step).first.wait_for(timeout=WAIT_MS)
        await open_tab(page, "User Metadata")
        await details_say(page, "active (ready) - 2 GPU slices for tenant acme")
        await details_say(page, f"bundles: {node}/0 (GPU 0000:10:00.0), {node}/1 (GPU 0000:11:00.0)")

        # The handed-over allocation's link opens its current run, which says where its story began.
        link = context.workflow_link(moves.id)
        assert link is not None
        await page.goto(link)
        await open_tab(page, "User Metadata")
        await details_say(page, f"This run continues the hold of run {moves.result_run_id} (asked: upgrade)")
        await details_say(page, f"node: {placed['ui-moves'].node}")

        # The operators' list of active allocations: each once, the run left behind by the hand-over not among them.
        query = urllib.parse.quote('BerthState="active"')
        await page.goto(f"{ui_server.ui_url}/namespaces/default/workflows?query={query}")
        for workflow_id in (stays.id, moves.id):
            await page.get_by_text(workflow_id, exact=True).first.wait_for(timeout=WAIT_MS)
        assert await page.get_by_text(moves.id, exact=True).count() == 1
        assert await page.get_by_text(stays.id, exact=True).count() == 1

        for name in ("ui-stays", "ui-moves"):
            await allocation_client.release(client, name)
        assert (await stays.result()).state == (await moves.result()).state == "released"
