// The live parts of a console page: each element with data-live is read again every data-every seconds (the
// page's URL with ?live=1 answers only that part) while the page is visible. One timer per element, one request
// at a time, aborted when the page hides or unloads: a page left open for a day holds no more than at its start.
"use strict";

function follow(element) {
  const every = Number(element.dataset.every || 5) * 1000;
  let timer = null;
  let inFlight = null;

  async function refresh() {
    timer = null;
    if (document.hidden) return;
    const url = new URL(element.dataset.live, window.location.href);
    url.searchParams.set("live", "1");
    inFlight = new AbortController();
    try {
      const answer = await fetch(url, { signal: inFlight.signal, credentials: "same-origin" });
      if (answer.redirected || answer.status === 401 || answer.status === 303) {
        window.location.reload(); // signed out meanwhile: the page says so
        return;
      }
      if (answer.ok) {
        const html = await answer.text();
        if (html !== element.innerHTML) element.innerHTML = html;
        element.removeAttribute("aria-busy");
        element.dataset.updated = new Date().toISOString();
      }
    } catch (error) {
      if (error.name !== "AbortError") element.setAttribute("aria-busy", "true");
    } finally {
      inFlight = null;
      schedule();
    }
  }

  function schedule() {
    if (timer === null && !document.hidden) timer = window.setTimeout(refresh, every);
  }

  function stop() {
    if (timer !== null) window.clearTimeout(timer);
    timer = null;
    if (inFlight !== null) inFlight.abort();
  }

  document.addEventListener("visibilitychange", () => (document.hidden ? stop() : schedule()));
  window.addEventListener("pagehide", stop);
  schedule();
}

document.addEventListener("DOMContentLoaded", () => {
  for (const element of document.querySelectorAll("[data-live]")) follow(element);
});
