"""`berth deploy apply|get|delete|list`: ModelDeployments through the HTTP API (admin token).

`apply -f FILE` reads the ModelDeployment documents of a YAML or JSON file (several per file, a Kubernetes `List`
too; other kinds are refused) and PUTs each one; `--wait` then follows each until every replica it could place is
ready. Text output is for people (Rich tables: the replicas with cluster, pools and phase, and for a deployment
short of replicas, the reason per cluster); `--output json` prints the API's answer unchanged.

Deployments are namespaced: `--namespace/-n` names the namespace (`default` when left out; for `apply`, each
document's own `metadata.namespace` unless `-n` is given); `list` shows every namespace unless `-n` narrows it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.table import Table
from rich.text import Text

from berth import Client
from cli import values
from cli.client import ApiOption, TokenOption, api_client
from cli.output import Column, OutputFormat, OutputOption, console, fail, is_data, print_data, styled, table
from contracts.http import DeploymentAccepted, DeploymentView
from contracts.manifest import DEFAULT_NAMESPACE

app = typer.Typer(help="Create, follow and delete ModelDeployments.", no_args_is_help=True, add_completion=False)

NameArgument = Annotated[str, typer.Argument(help="The deployment's name.", show_default=False)]
NamespaceOption = Annotated[
    str | None, typer.Option("--namespace", "-n", help="The deployment's namespace [default: default].")
]
PHASE_STYLES = {"FullyScheduled": "green", "PartiallyScheduled": "yellow", "ScheduleFailed": "red"}
REPLICA_STYLES = {"ready": "green", "starting": "yellow", "removing": "dim", "failed": "red"}
POLL_SECONDS = 0.5


def _styled(value: str | None, styles: dict[str, str]) -> Text:
    return Text(value or "-", style=styles.get(value or "", "yellow"))


def qualified_name(name: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """A deployment as an operator tells it apart: `<namespace>/<name>` outside `default`."""
    return name if namespace == DEFAULT_NAMESPACE else f"{namespace}/{name}"


def _addressed(namespace: str) -> str | None:
    """The client's `namespace=` for a namespace: None for `default`, which keeps the path it always had
    (`/v1/deployments/NAME`), so this CLI works with an API from before namespaces too."""
    return None if namespace == DEFAULT_NAMESPACE else namespace


def _namespace_of(document: dict[str, Any], option: str | None) -> str:
    """`-n` when given (the API refuses a document that says otherwise, naming metadata.namespace), else the
    document's own namespace, else `default`."""
    if option is not None:
        return option
    given = (document.get("metadata") or {}).get("namespace")
    return given if isinstance(given, str) and given else DEFAULT_NAMESPACE


def _documents(file: Path) -> list[dict[str, Any]]:
    """The ModelDeployments in the file; anything else in it is an error (nothing is sent)."""
    try:
        text = file.read_text()
    except OSError as error:
        fail(f"-f {file}: cannot read it ({error.strerror})")
    try:
        loaded = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        fail(f"-f {file}: not YAML or JSON: {' '.join(str(error).split())}")
    documents: list[Any] = []
    for document in loaded:
        items = document.get("items") if isinstance(document, dict) and document.get("kind") == "List" else None
        documents.extend(items if isinstance(items, list) else [document])
    deployments = []
    for number, document in enumerate(documents, 1):
        kind = document.get("kind") if isinstance(document, dict) else None
        if kind != "ModelDeployment":
            fail(f"-f {file}: document {number} is {kind or 'not an object'}, not a ModelDeployment")
        name = (document.get("metadata") or {}).get("name")
        if not isinstance(name, str) or not name:
            fail(f"-f {file}: document {number} has no metadata.name")
        deployments.append(document)
    if not deployments:
        fail(f"-f {file}: holds no ModelDeployment")
    return deployments


def _render(view: DeploymentView) -> None:
    summary = Table.grid(padding=(0, 2))
    summary.add_row("Deployment", styled("[bold]{}[/] ({})", qualified_name(view.name, view.namespace), view.state))
    summary.add_row(
        "Replicas",
        f"{view.available} available, {view.scheduled} scheduled, {view.desired} desired"
        + (f", min {view.min_replicas}" if view.min_replicas is not None else ""),
    )
    phase = _styled(view.phase, PHASE_STYLES)
    summary.add_row("Phase", styled("{} {}", phase, view.message) if view.message else phase)
    summary.add_row(
        "Workflow", styled("{}" if view.live else "{} [dim](not answering; last recorded)[/]", view.workflow_id)
    )
    console.print(summary)
    if view.replicas:
        replicas = table(
            Column("replica", key=True), "cluster", "index", "pools", "nodes", "phase", "gateway", title="Replicas"
        )
        for r in view.replicas:
            replicas.add_row(
                r.name,
                r.cluster,
                str(r.index),
                ", ".join(f"{engine}: {pool}" for engine, pool in r.pools.items()),
                str(r.nodes),
                _styled(r.phase, REPLICA_STYLES),
                r.gateway_address or "-",
            )
        replicas.print()
    if view.clusters:
        why = table(Column("cluster", key=True), "reason", "message", title="Why not more")
        for c in view.clusters:
            why.add_row(c.cluster, c.reason, c.message)
        why.print()
    for failure in view.recent_failures[-3:]:
        console.print(styled("[red]failed:[/] {}", failure))
    for removal in view.recent_removals[-3:]:
        console.print(styled("[yellow]removed:[/] {}", removal))


def _settled(view: DeploymentView) -> bool:
    return view.state == "steady" and all(r.phase == "ready" for r in view.replicas)


def _wait(client: Client, name: str, namespace: str, timeout: str) -> DeploymentView:
    deadline = time.monotonic() + values.seconds(timeout, "--timeout")
    while True:
        view = client.deployments.get(name, namespace=_addressed(namespace))
        if _settled(view):
            return view
        if time.monotonic() > deadline:
            follow = f"berth deploy get {name}" + ("" if namespace == DEFAULT_NAMESPACE else f" -n {namespace}")
            fail(
                f"deployment {qualified_name(name, namespace)} is not settled after {timeout}; "
                f"follow it with `{follow}`"
            )
        time.sleep(POLL_SECONDS)


@app.command("apply")
def apply(
    file: Annotated[Path, typer.Option("--file", "-f", help="ModelDeployment file (YAML or JSON).")],
    wait: Annotated[bool, typer.Option("--wait", help="Wait until every placed replica is ready.")] = False,
    timeout: Annotated[str, typer.Option("--timeout", help="How long --wait waits at most (5m, 90s).")] = "5m",
    namespace: NamespaceOption = None,
    output: OutputOption = OutputFormat.TEXT,
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """Create or update the ModelDeployments in FILE; their workflows place and start the replicas."""
    documents = _documents(file)
    values.seconds(timeout, "--timeout")
    accepted_all: list[DeploymentAccepted] = []
    views: list[DeploymentView] = []
    with api_client(api, token) as client:
        for document in documents:
            name, where = document["metadata"]["name"], _namespace_of(document, namespace)
            # A document naming no namespace, sent to `default`, keeps its old path; otherwise the namespace is
            # named, so that `-n` is where it goes and the API refuses a document that says otherwise.
            unnamed = where == DEFAULT_NAMESPACE and not (document.get("metadata") or {}).get("namespace")
            accepted = client.deployments.apply(document, namespace=None if unnamed else where)
            if not is_data(output):
                verb = "Created" if accepted.created else "Updated"
                console.print(styled("{} deployment [bold]{}[/].", verb, qualified_name(name, where)))
            if wait:
                views.append(_wait(client, name, where, timeout))
            else:
                accepted_all.append(accepted)
    if is_data(output):
        answers = views if wait else accepted_all
        dumped = [answer.model_dump(mode="json", by_alias=True) for answer in answers]
        print_data(dumped[0] if len(dumped) == 1 else dumped, output)
    elif wait:
        for view in views:
            _render(view)
    else:
        console.print("Follow with `berth deploy get NAME`.", style="dim", highlight=False)


@app.command("get")
def get(
    name: NameArgument,
    namespace: NamespaceOption = None,
    output: OutputOption = OutputFormat.TEXT,
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """A deployment: desired vs available, each replica's cluster and pools, and why not more."""
    with api_client(api, token) as client:
        view = client.deployments.get(name, namespace=_addressed(namespace or DEFAULT_NAMESPACE))
    if is_data(output):
        print_data(view.model_dump(mode="json", by_alias=True), output)
    else:
        _render(view)


@app.command("list")
def list_(
    namespace: NamespaceOption = None,
    output: OutputOption = OutputFormat.TEXT,
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """Every deployment (of every namespace, unless -n names one) with its last recorded status."""
    with api_client(api, token) as client:
        page = client.deployments.page(namespace=namespace or None)  # the API's first page, as it always was
    if is_data(output):
        print_data(page.model_dump(mode="json", by_alias=True), output)
        return
    deployments = page.deployments
    if not deployments:
        console.print("no deployments", style="dim")
        return
    rows = table(
        "namespace",
        Column("name", key=True),
        "state",
        Column("available", number=True),
        Column("desired", number=True),
        "phase",
        "message",
    )
    for d in deployments:
        rows.add_row(
            d.namespace,
            d.name,
            d.state or "-",
            str(d.available),
            str(d.desired),
            _styled(d.phase, PHASE_STYLES),
            d.message,
        )
    rows.print()


@app.command("delete")
def delete(
    name: NameArgument,
    namespace: NamespaceOption = None,
    output: OutputOption = OutputFormat.TEXT,
    api: ApiOption = None,
    token: TokenOption = None,
) -> None:
    """Tear down every replica of the deployment (workloads deleted, ledger released), then the deployment."""
    where = namespace or DEFAULT_NAMESPACE
    with api_client(api, token) as client:
        data = client.deployments.delete(name, namespace=_addressed(where)).model_dump(mode="json", by_alias=True)
    if is_data(output):
        print_data(data, output)
    else:
        console.print(
            styled("Deleting deployment [bold]{}[/]; its replicas are being torn down.", qualified_name(name, where))
        )


__all__ = ["app"]
