"""What applying a fleet file changed, object by object: the answer of `PUT /v1/fleet` and of `berth migrate`'s first
load, as the store computes it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

# "carried": read and checked, not inventory, so not written (a ModelService: Modelplane's routing, not capacity).
Action = Literal["created", "updated", "deleted", "kept", "carried"]


class ApplyChange(BaseModel):
    kind: str
    name: str
    action: Action
