"""`berth alloc create|list|get|cancel|retry|release|extend`: GPU allocations through the HTTP API.

Each command is one call of the Python client (`berth.Client`, through cli/client.py); with `--wait`, `create` then
follows the allocation until it is active or has ended, and `cancel` and `release` until it has ended, each for
`--timeout` at most, by long polls that answer when its state changes (`client.allocations.watch`). Text output is for people (Rich
tables; `get` tells the allocation's story as attempts and a timeline of its events); `-o json` or `-o yaml` prints
the API's answer unchanged, for scripts. Durations and times are read by cli/values.py before anything is sent.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from berth import Client
from cli import queue as queue_view
from cli import values
from cli.client import ApiOption, TenantOption, TokenOption, acting_tenant, api_client
from cli.output import Column, OutputFormat, OutputOption, console, fail, is_data, print_data, styled, table
from config.context import discovered_context
from config.settings import Settings
from contracts.allocation import FINAL_STATES
from contracts.http import AllocationAccepted, AllocationDetail, AllocationList, AllocationSummary
from contracts.placement import CapacityShape

app = typer.Typer(help="Request, follow and give back GPU allocations.", no_args_is_help=True, add_completion=False)

IdArgument = Annotated[str, typer.Argument(help="The allocation's id.", show_default=False)]
# A final state is recorded a moment after the workflow reports it: the gap between the reads that wait for that.
RECORDED_POLL_SECONDS = 0.2
KEY_PREFIXES = ("ssh-", "ecdsa-", "sk-")
STATE_STYLES = {
    "active": "green",
    "preempting": "yellow",
    "preempted": "dim",
    "failed": "red",
    "released": "dim",
    "cancelled": "dim",
    "expired": "dim",
    "queued": "cyan",
}
OUTCOME_STYLES = {"succeeded": "green", "failed": "red", "abandoned": "yellow", "cancelled": "dim"}


def _styled(value: str, styles: dict[str, str], default: str = "yellow") -> Text:
    return Text(value, style=styles.get(value, default))


def _ssh_key(value: str) -> str:
    """A public key as given, or read from the file named (such as ~/.ssh/id_ed25519.pub)."""
    if value.startswith(KEY_PREFIXES):
        return value
    path = Path(value).expanduser()
    try:
        return path.read_text().strip()
    except OSError as error:
        fail(f"--ssh-key: {value!r} is neither an SSH public key nor a readable file ({error.strerror})")


def _user_data(path: Path | None) -> str | None:
    """The cloud-config document in the file named, as text; the API checks what it says."""
    if path is None:
        return None
    try:
        return path.expanduser().read_text(encoding="utf-8")
    except OSError as error:
        fail(f"--user-data: cannot read {str(path)!r} ({error.strerror})", reason="invalid_argument")
    except UnicodeDecodeError:
        fail(f"--user-data: {str(path)!r} is not UTF-8 text", reason="invalid_argument")


def key_values(pairs: list[str], option: str) -> dict[str, str]:
    """`KEY=VALUE` options (`--label`, `--cluster-selector`) as a mapping; a malformed one is a one-line error."""
    labels: dict[str, str] = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            fail(f"{option}: expected KEY=VALUE, got {pair!r}")
        labels[key] = value
    return labels


SelectorOption = Annotated[
    list[str] | None,
    typer.Option(
        "--selector",
        help="DRA CEL selector the GPU device must satisfy (repeatable), e.g. "
        '\'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("141Gi")) >= 0\'.',
    ),
]
ClusterSelectorOption = Annotated[
    list[str] | None, typer.Option("--cluster-selector", help="LABEL=VALUE the cluster must carry (repeatable).")
]
NodeOption = Annotated[
    list[str] | None,
    typer.Option("--node", help="Pin to this node (repeatable): refused, never placed elsewhere, if none can take it."),
]

TimeoutOption = Annotated[str, typer.Option("--timeout", help="How long --wait waits at most (10m, 90s).")]

GpuOption = Annotated[
    list[str] | None,
    typer.Option(
        "--gpu", help="Pin this GPU (PCI address, repeatable) of the one --node: exactly these, as many as --gpus."
    ),
]


def placement_fields(
    selectors: list[str] | None,
    cluster_selector: list[str] | None,
    nodes: list[str] | None,
    gpus: list[str] | None = None,
) -> dict[str, Any]:
    """The request body's placement constraints, left out when not given (so older APIs still accept the body)."""
    fields: dict[str, Any] = {
        "selectors": selectors or [],
        "cluster_selector": key_values(cluster_selector or [], "--cluster-selector"),
        "nodes": nodes or [],
        "gpus": gpus or [],
    }
    return {key: value for key, value in fields.items() if value}


# Rendering -----------------------------------------------------------------------------------------------------


def _request(allocation: AllocationSummary) -> str:
    product = f" {allocation.gpu_product}" if allocation.gpu_product else ""
    return f"{allocation.gpu_count}{product} GPU{'s' if allocation.gpu_count != 1 else ''}, {allocation.shape}"


def _render_list(allocations: list[AllocationSummary]) -> None:
    if not allocations:
        console.print("no allocations", style="dim")
        return
    rows = table(
        Column("id", key=True),
        "tenant",
        "state",
        "request",
        "region",
        "pool",
        Column("node", key=True),
        "created",
        Column("ends", wide=True),
        Column("workflow", wide=True),
    )
    for allocation in allocations:
        rows.add_row(
            allocation.id,
            allocation.tenant,
            _styled(allocation.state, STATE_STYLES),
            _request(allocation),
            allocation.region or "-",
            allocation.pool or "-",
            allocation.node or "-",
            allocation.created_at.astimezone().strftime("%Y-%m-%d %H:%M:%S"),
            allocation.ends_at.astimezone().strftime("%Y-%m-%d %H:%M:%S") if allocation.ends_at else "-",
            allocation.workflow_id,
        )
    rows.print()


def _ui_link(workflow_id: str) -> str | None:
    """The allocation's page in the Temporal UI, where `berth up`'s context says the UI is."""
    context = discovered_context(Settings())
    return context.workflow_link(workflow_id) if context is not None else None


def _render_detail(allocation: AllocationDetail) -> None:
    """The allocation's story: what it is now, the bundles it holds, each attempt, and every step with its time."""
    state = _styled(allocation.state, STATE_STYLES)
    summary = Table.grid(padding=(0, 2))
    summary.add_row("Allocation", styled("[bold]{}[/] ({})", allocation.id, allocation.tenant))
    if allocation.requested_by:
        summary.add_row("Asked by", Text(allocation.requested_by))
    summary.add_row("State", styled("{} [dim]step {}[/]", state, allocation.step) if allocation.step else state)
    summary.add_row("Request", _request(allocation))
    summary.add_row("Placed", " / ".join(v or "-" for v in (allocation.region, allocation.pool, allocation.node)))
    summary.add_row("Workflow", styled("{}" if allocation.live else "{} [dim](not running)[/]", allocation.workflow_id))
    if (link := _ui_link(allocation.workflow_id)) is not None:
        summary.add_row("Temporal UI", Text(link))
    if allocation.failure_reason:
        summary.add_row("Failure", Text(allocation.failure_reason, style="red"))
    if allocation.ends_at is not None:
        summary.add_row("Ends", allocation.ends_at.isoformat())
    if allocation.queue is not None:
        place = allocation.queue
        summary.add_row(
            "Queue",
            styled(
                "position [bold]{}[/] in {}, priority {}, waited {}, deadline {}",
                place.position,
                place.region,
                queue_view.priority(place),
                queue_view.waited(place.waited_seconds),
                queue_view.local_time(place.deadline_at),
            ),
        )
        summary.add_row("Waiting", queue_view.status(place))
    console.print(summary)

    if allocation.bundles:
        bundles = table(Column("slot", key=True), "GPU", "fabric VF", "NUMA", "MAC", "IP", title="Bundles")
        for bundle in allocation.bundles:
            bundles.add_row(
                str(bundle.slot_id),
                bundle.gpu_pci,
                bundle.fabric_vf_pci or "-",
                str(bundle.numa_node),
                bundle.mac_address or "-",
                bundle.private_ip or "-",
            )
        bundles.print()

    if allocation.attempts:
        attempts = table("#", Column("node", key=True), "outcome", "reason", title="Attempts")
        for attempt in allocation.attempts:
            attempts.add_row(
                str(attempt.number),
                attempt.node or "-",
                _styled(attempt.outcome, OUTCOME_STYLES),
                attempt.reason or "",
            )
        attempts.print()

    timeline = table(Column("after", number=True), "state", "step", "by", "attempt", "node", "note", title="Timeline")
    for event in allocation.events:
        after = (event.at - allocation.created_at).total_seconds()
        timeline.add_row(
            f"{after:+.1f}s",
            _styled(event.state, STATE_STYLES),
            event.step,
            event.actor or "",
            str(event.attempt) if event.attempt is not None else "",
            event.node or "",
            event.reason or "",
        )
    timeline.print()


def _show_accepted(data: dict[str, Any], output: OutputFormat, doing: str) -> None:
    if is_data(output):
        print_data(data, output)
        return
    accepted = AllocationAccepted.model_validate(data)
    console.print(styled("{} allocation [bold]{}[/] (now {}).", doing, accepted.id, accepted.state))
    console.print(f"Follow it with `berth alloc get {accepted.id}`.", style="dim", highlight=False)


def _wait(
    client: Client, allocation_id: str, timeout: str, output: OutputFormat, *, active_will_do: bool = True
) -> AllocationDetail:
    """Follow the allocation until it has ended (or, with `active_will_do`, is active), telling each new state as
    it comes (text output); past `timeout` (as typed, already checked) one error line says where it stands. Waiting
    for the end, a final state counts once recorded: the workflow's status says `released` a moment before its
    last step is written, and a script whose wait ended reads the allocation next."""
    seconds = values.seconds(timeout, "--timeout")
    deadline = time.monotonic() + seconds
    allocation: AllocationDetail | None = None
    for allocation in client.allocations.watch(allocation_id, timeout=seconds):
        _tell(allocation, output)
        if active_will_do and allocation.state == "active":
            break
    assert allocation is not None  # the watch yields the allocation as it is first
    while allocation.state in FINAL_STATES and allocation.live and not active_will_do:
        if time.monotonic() > deadline:
            break
        time.sleep(RECORDED_POLL_SECONDS)
        allocation = client.allocations.get(allocation_id)
    done = allocation.state in FINAL_STATES and (active_will_do or not allocation.live)
    if not (done or (active_will_do and allocation.state == "active")):
        fail(
            f"allocation {allocation_id} is still {allocation.state} after {timeout}; "
            f"follow it with `berth alloc get {allocation_id}`"
        )
    if is_data(output):
        print_data(allocation.model_dump(mode="json"), output)
    else:
        _render_detail(allocation)
    return allocation


def _tell(allocation: AllocationDetail, output: OutputFormat) -> None:
    """One line per state (and node) the allocation reaches while a person waits."""
    if not is_data(output):
        on = f" on {allocation.node}" if allocation.node else ""
        console.print(styled("  {}{}", _styled(allocation.state, STATE_STYLES), on))


# Commands ------------------------------------------------------------------------------------------------------


@app.command("create")
def create(
    gpus: Annotated[int, typer.Option("--gpus", min=1, help="GPUs wanted.")],
    product: Annotated[str | None, typer.Option("--product", help="GPU product, e.g. H200; unset: any.")] = None,
    shape: Annotated[CapacityShape, typer.Option("--shape", help="gpu_slice or baremetal.")] = CapacityShape.GPU_SLICE,
    region: Annotated[str | None, typer.Option("--region", help="Region; unset lets the scheduler choose.")] = None,
    tenant: TenantOption = None,
    image: Annotated[str | None, typer.Option("--image", help="VM image.")] = None,
    ssh_keys: Annotated[
        list[str] | None, typer.Option("--ssh-key", help="SSH public key, or a file holding one (repeatable).")
    ] = None,
    user_data: Annotated[
        Path | None,
        typer.Option(
            "--user-data",
            help="A cloud-init #cloud-config file for the VM (at most 64 KiB), merged into its seed; it may not set "
            "hostname, fqdn, ssh_authorized_keys, ssh_pwauth, disable_root or users.",
        ),
    ] = None,
    labels: Annotated[list[str] | None, typer.Option("--label", help="KEY=VALUE (repeatable).")] = None,
    selector: SelectorOption = None,
    cluster_selector: ClusterSelectorOption = None,
    node: NodeOption = None,
    gpu: GpuOption = None,
    idempotency_key: Annotated[
        str | None, typer.Option("--idempotency-key", help="Repeat the request safely: same key, same allocation.")
    ] = None,
    queue_timeout: Annotated[
        str | None,
        typer.Option(
            "--queue-timeout",
            help="Wait this long for capacity (30m, 2h, 90s) instead of failing when nothing can take it now; "
            "0 never waits. Unset: the tenant's default.",
        ),
    ] = None,
    priority_class: Annotated[
        str | None, typer.Option("--priority-class", help="A PriorityClass of the fleet: who waits is placed first.")
    ] = None,
    duration: Annotated[
        str | None,
        typer.Option(
            "--duration", help="Hold it this long once active (48h, 90m; a unit is required), then release it."
        ),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(
            "--until",
            help="Hold it until this time: 2026-12-01T09:00:00Z, tomorrow, now+8h (ISO 8601 or "
            "relative to now, as `date -d` reads them).",
        ),
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait until it is active; exit 1 if it fails.")] = False,
    timeout: TimeoutOption = "10m",
    output: OutputOption = OutputFormat.TEXT,
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """Request GPUs: a VM on GPU slices, or a whole bare-metal host, optionally constrained by DRA CEL selectors over
    the GPU device, cluster labels, or pinned nodes. With --queue-timeout it waits in its region's queue when no
    node can take it now (`berth queue` shows its place)."""
    wait_for = values.duration(queue_timeout, "--queue-timeout")
    lease, ends_at = values.duration(duration, "--duration"), values.rfc3339(until, "--until")
    values.seconds(timeout, "--timeout")
    tenant = acting_tenant(tenant, token, announce=not is_data(output))
    body = {
        "gpu_count": gpus,
        "gpu_product": product,
        "shape": shape.value,
        "region": region,
        "tenant": tenant,
        "image": image,
        "ssh_public_keys": [_ssh_key(key) for key in ssh_keys or []],
        "user_data": _user_data(user_data),
        "labels": key_values(labels or [], "--label"),
        **placement_fields(selector, cluster_selector, node, gpu),
        "queue": {"timeout": wait_for} if wait_for is not None else None,
        "priority_class": priority_class,
        "duration": lease,
        "ends_at": ends_at,
    }
    with api_client(api, token, tenant) as client:
        accepted = client.allocations.create(
            {k: v for k, v in body.items() if v is not None}, idempotency_key=idempotency_key
        )
        data = accepted.model_dump(mode="json")
        if not wait:
            _show_accepted(data, output, "Created")
            return
        allocation_id = accepted.id
        if not is_data(output):
            console.print(styled("Allocation [bold]{}[/] created; waiting until it is active ...", allocation_id))
        allocation = _wait(client, allocation_id, timeout, output)
    if allocation.state == "failed":
        fail(f"allocation {allocation_id} failed: {allocation.failure_reason or 'no reason recorded'}")
    if allocation.state != "active":
        fail(f"allocation {allocation_id} ended {allocation.state} before becoming active")


@app.command("list")
def list_(
    state: Annotated[str | None, typer.Option("--state", help="Only allocations in this state.")] = None,
    region: Annotated[str | None, typer.Option("--region", help="Only allocations in this region.")] = None,
    node: Annotated[str | None, typer.Option("--node", help="Only allocations on this node.")] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=1000, help="At most this many a page, newest first.")
    ] = 100,
    cursor: Annotated[
        str | None, typer.Option("--cursor", help="Start at this page (the `next_cursor` a list printed).")
    ] = None,
    every: Annotated[bool, typer.Option("--all", help="Follow the pages to the oldest allocation.")] = False,
    tenant: TenantOption = None,
    output: OutputOption = OutputFormat.TEXT,
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """List allocations, newest first, a page at a time (a tenant sees only its own)."""
    query = {"state": state, "region": region, "node": node, "tenant": tenant, "limit": limit}
    with api_client(api, token, tenant) as client:
        page = client.allocations.page(**query, cursor=cursor)
        rows = list(page.allocations)
        while every and page.next_cursor:
            page = client.allocations.page(**query, cursor=page.next_cursor)
            rows.extend(page.allocations)
        listed = AllocationList(allocations=rows, next_cursor=page.next_cursor).model_dump(mode="json")
        if is_data(output):
            print_data(listed, output)
            return
        page = AllocationList.model_validate(listed)
        _render_list(page.allocations)
        if page.next_cursor:
            more = f"More: berth alloc list --cursor {page.next_cursor} (or --all)."
            console.print(more, style="dim", highlight=False, soft_wrap=True)  # one line to copy; markup is off


@app.command("get")
def get(
    allocation_id: IdArgument,
    tenant: TenantOption = None,
    output: OutputOption = OutputFormat.TEXT,
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """Show one allocation: where it is, its bundles, each attempt, and the timeline of its steps."""
    with api_client(api, token, tenant) as client:
        allocation = client.allocations.get(allocation_id)
        if is_data(output):
            print_data(allocation.model_dump(mode="json"), output)
        else:
            _render_detail(allocation)


def _end(
    allocation_id: str,
    action: str,
    doing: str,
    wait: bool,
    timeout: str,
    output: OutputFormat,
    api: str | None,
    token: str | None,
    tenant: str | None,
) -> None:
    """Cancel or release; with `wait`, until the allocation has ended (exit 1 past `timeout`)."""
    values.seconds(timeout, "--timeout")
    with api_client(api, token, tenant) as client:
        ending = client.allocations.release if action == "release" else client.allocations.cancel
        data = ending(allocation_id).model_dump(mode="json")
        if not wait:
            _show_accepted(data, output, doing)
            return
        if not is_data(output):
            console.print(styled("{} allocation [bold]{}[/]; waiting until it has ended ...", doing, allocation_id))
        _wait(client, allocation_id, timeout, output, active_will_do=False)


WaitEndOption = Annotated[bool, typer.Option("--wait", help="Wait until it has ended; exit 1 past --timeout.")]


@app.command("cancel")
def cancel(
    allocation_id: IdArgument,
    wait: WaitEndOption = False,
    timeout: TimeoutOption = "10m",
    tenant: TenantOption = None,
    output: OutputOption = OutputFormat.TEXT,
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """Cancel an allocation being placed or active: everything it holds is undone and it ends cancelled."""
    _end(allocation_id, "cancel", "Cancelling", wait, timeout, output, api, token, tenant)


@app.command("retry")
def retry(
    allocation_id: IdArgument,
    exclude: Annotated[
        list[str] | None, typer.Option("--exclude", help="A node not to try again (repeatable).")
    ] = None,
    tenant: TenantOption = None,
    output: OutputOption = OutputFormat.TEXT,
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """Being placed: give up the current node and go on with the next. Failed: place it again."""
    with api_client(api, token, tenant) as client:
        data = client.allocations.retry(allocation_id, exclude_nodes=exclude or []).model_dump(mode="json")
        _show_accepted(data, output, "Retrying")


@app.command("extend")
def extend(
    allocation_id: IdArgument,
    by: Annotated[str | None, typer.Option("--by", help="Move the end later by this much (2h, 30m).")] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="The new end: ISO 8601 or relative to now (tomorrow, now+8h).")
    ] = None,
    tenant: TenantOption = None,
    output: OutputOption = OutputFormat.TEXT,
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """Move an active allocation's end later; refused past its pool's maxLease."""
    if (by is None) == (until is None):
        fail("give exactly one of --by and --until")
    by, until = values.duration(by, "--by"), values.rfc3339(until, "--until")
    with api_client(api, token, tenant) as client:
        data = client.allocations.extend(allocation_id, by=by, until=until).model_dump(mode="json")
    if is_data(output):
        print_data(data, output)
        return
    console.print(styled("Allocation [bold]{}[/] now ends at {}", data["id"], data["ends_at"]))


@app.command("release")
def release(
    allocation_id: IdArgument,
    wait: WaitEndOption = False,
    timeout: TimeoutOption = "10m",
    tenant: TenantOption = None,
    output: OutputOption = OutputFormat.TEXT,
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """Give back an active allocation: its VM is destroyed and its GPUs wiped and returned."""
    _end(allocation_id, "release", "Releasing", wait, timeout, output, api, token, tenant)
