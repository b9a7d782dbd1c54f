"""What a person does in the console, for the browser tests: sign in (through the provider's page, or with a token),
keep what the page received, walk it with the keyboard, and save a page's picture for docs/operating.md."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from playwright.async_api import Browser, BrowserContext, Page, Response, expect

from tests.identity.provider import Provider

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "images" / "console"
TEMPORAL_UI = "http://temporal-ui.test:8233"  # never opened: the console only links to it
VIEWPORT = {"width": 1280, "height": 800}
WAIT_MS = 30_000  # generous: a loaded machine is slow, never wrong
expect.set_options(timeout=WAIT_MS)  # every expect() waits as long as the page and its context do


async def new_page(browser: Browser, base_url: str) -> tuple[BrowserContext, Page]:
    """A browser profile of its own (its own cookies: one person) and a tab in it."""
    context = await browser.new_context(viewport=VIEWPORT, base_url=base_url)
    context.set_default_timeout(WAIT_MS)
    return context, await context.new_page()


async def sign_in_person(
    browser: Browser, base_url: str, provider: Provider, person: str, *groups: str, start: str = "/console/allocations"
) -> tuple[BrowserContext, Page]:
    """`person` (in `groups`) opens `start`, is sent to the login page, chooses the company account, authorizes at
    the provider's own page, and comes back to `start` signed in."""
    provider.put_user(person, email=person, groups=list(groups))
    context, page = await new_page(browser, base_url)
    await page.goto(start)
    await page.wait_for_url("**/console/login?**")
    await page.get_by_role("link", name="Sign in with your company account").click()
    await page.locator("input[name=sub]").fill(person)  # the provider's page: who is signing in
    await page.get_by_role("button", name="Authorize").click()
    await page.wait_for_url(f"{base_url}{start}")
    return context, page


async def sign_in_token(browser: Browser, base_url: str, token: str, start: str = "/console/allocations") -> Page:
    """A Berth token pasted at the login page, as on the dev stack."""
    _, page = await new_page(browser, base_url)
    await page.goto(start)
    await page.get_by_label("Token").fill(token)
    await page.get_by_role("button", name="Sign in").click()
    await page.wait_for_url(f"{base_url}{start}")
    return page


@dataclass
class Received:
    """Every response body a page received (documents, live refreshes, scripts, styles), by URL."""

    bodies: list[tuple[str, str]] = field(default_factory=list)

    async def keep(self, response: Response) -> None:
        if 300 <= response.status < 400:
            return  # a redirect has no body a browser reads
        try:
            self.bodies.append((response.url, (await response.body()).decode("utf-8", "replace")))
        except Exception as error:  # a response the browser already let go of: say which, never hide it
            self.bodies.append((response.url, f"<body unreadable: {error}>"))

    def mentioning(self, text: str) -> list[str]:
        return [url for url, body in self.bodies if text in body]


async def screenshot(page: Page, name: str) -> None:
    """docs/images/console/<name>.png, only when BERTH_SCREENSHOTS=1 (so a test run never rewrites the tree)."""
    if os.environ.get("BERTH_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=SCREENSHOTS / f"{name}.png")


async def tab_stops(page: Page, limit: int = 60) -> list[str]:
    """What Tab reaches from the top of the page (freshly loaded: focus at its start), in order: each focused
    element's text (or label), until focus leaves the page or `limit` presses."""
    reached: list[str] = []
    for _ in range(limit):
        await page.keyboard.press("Tab")
        said = await page.evaluate(
            """() => { const e = document.activeElement;
                       if (!e || e === document.body) return null;
                       return (e.innerText || e.value || e.getAttribute('aria-label') || e.tagName).trim(); }"""
        )
        if said is None:
            break
        reached.append(said)
    return reached


async def focused(page: Page) -> str:
    return await page.evaluate("(document.activeElement.innerText || '').trim()")


async def colourless(page: Page) -> list[str]:
    """The state and GPU cells that say nothing in words (colour alone): each must carry text, or a label."""
    return await page.evaluate(
        """() => [...document.querySelectorAll('.state, [data-state], [class*="gpu"]')]
                 .filter(e => !(e.innerText || '').trim() && !e.getAttribute('aria-label') && !e.getAttribute('title'))
                 .map(e => e.outerHTML.slice(0, 120))"""
    )
