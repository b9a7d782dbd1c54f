"""Rule 7: does a pool's InferenceClass satisfy a member's device requests, and what would the member claim?

The requests describe what one pod needs from its node, so they are matched against one node's devices. Requests
are taken in order, each taking the first device that satisfies all its selectors and still has enough count left;
counts are shared across the member's requests (two requests of 5 do not fit a device of count 8). Greedy without
backtracking, as Modelplane does: it can refuse a fit a cleverer search would find, never accept one that does not
exist. A Synthetic device matches but is never claimed, so it adds no claim and no node cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleet.deployment import DeviceRequest
from fleet.inference_class import ClaimKind, InferenceClass
from scheduler.deployment.selectors import DeviceSelectors


@dataclass(frozen=True)
class Claim:
    """A resolved, claimable request as it is stamped on the replica."""

    name: str
    count: int
    device: str
    selectors: tuple[str, ...] = ()
    device_class_name: str | None = None  # the DRA DeviceClass the device is claimed through


def match_requests(
    requests: Sequence[DeviceRequest], inference_class: InferenceClass, selectors: DeviceSelectors
) -> tuple[Claim, ...] | str:
    """The claims the requests resolve to on one node of this class, or why they do not fit."""
    devices = inference_class.spec.devices
    class_name = inference_class.metadata.name
    remaining = [device.count for device in devices]
    claims: list[Claim] = []
    for request in requests:
        expressions = [s.cel for s in request.selectors]
        chosen = None
        errors: list[str] = []
        for i, device in enumerate(devices):
            if remaining[i] < request.count:
                continue
            verdicts = [selectors.verdict(e, class_name, device) for e in expressions]
            errors.extend(v.error for v in verdicts if v.error)
            if all(v.matches for v in verdicts):
                chosen = i
                break
        if chosen is None:
            return _no_device(request, class_name, errors)
        remaining[chosen] -= request.count
        device = devices[chosen]
        if device.claim is ClaimKind.DRA:
            claims.append(
                Claim(
                    name=request.name,
                    count=request.count,
                    device=device.name,
                    selectors=tuple(expressions),
                    device_class_name=device.claimed_through,
                )
            )
    return tuple(claims)


def _no_device(request: DeviceRequest, class_name: str, errors: list[str]) -> str:
    left = f" with {request.count} left" if request.count != 1 else ""
    text = f"request {request.name!r}: no device of class {class_name} satisfies its selectors{left}"
    return f"{text} ({errors[0]})" if errors else text
