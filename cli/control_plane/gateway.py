"""`berth gateway`: the node gateway, the only address of the control plane's Temporal that GPU hosts are given.

It runs beside the API and the control worker (it reads node tokens from PostgreSQL and holds the control plane's
Temporal credentials) and lets each node agent poll its own task queue and answer its own tasks, nothing else
(gateway/README.md).
"""

from __future__ import annotations

import asyncio
import logging

from cli.control_plane.worker import ReadyFileOption
from cli.output import fail
from config.context import NotConfigured
from config.settings import Settings
from devstack.ready import mark_ready
from store.outage import UNREACHABLE_OR_REFUSED


def gateway(ready_file: ReadyFileOption = None) -> None:
    """Serve node agents on BERTH_GATEWAY_LISTEN: their own task queue and their own tasks, nothing else."""
    from gateway.serve import run_gateway

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = Settings()
    try:
        asyncio.run(run_gateway(settings, (lambda: mark_ready(ready_file)) if ready_file else None))
    except NotConfigured as exc:
        fail(str(exc))
    except (OSError, ValueError) as exc:
        fail(f"cannot run the node gateway: {exc}")
    except UNREACHABLE_OR_REFUSED as exc:  # after OSError above: the driver's own errors
        fail(f"cannot reach the database: {exc}")
