"""The custom search attributes that let operators list and filter Berth's work in the Temporal UI.

Registered by `berth up` and by the test fixtures; workers check they exist at start-up so a production server that
lacks them fails loudly instead of silently dropping visibility.
"""

from __future__ import annotations

from datetime import datetime

from temporalio.common import SearchAttributeIndexedValueType, SearchAttributeKey

KIND: SearchAttributeKey[str] = SearchAttributeKey.for_keyword("BerthKind")
STATE: SearchAttributeKey[str] = SearchAttributeKey.for_keyword("BerthState")
REGION: SearchAttributeKey[str] = SearchAttributeKey.for_keyword("BerthRegion")
NODE: SearchAttributeKey[str] = SearchAttributeKey.for_keyword("BerthNode")
TENANT: SearchAttributeKey[str] = SearchAttributeKey.for_keyword("BerthTenant")
GPU_COUNT: SearchAttributeKey[int] = SearchAttributeKey.for_int("BerthGpuCount")
# An allocation with an end: when it ends, and whether its owner has been warned that it ends soon.
ENDS_AT: SearchAttributeKey[datetime] = SearchAttributeKey.for_datetime("BerthEndsAt")
EXPIRING: SearchAttributeKey[bool] = SearchAttributeKey.for_bool("BerthExpiring")

# Who asked for it: the person (their OIDC username) or the service account (`token:<id> (label)`).
ACTOR: SearchAttributeKey[str] = SearchAttributeKey.for_keyword("BerthActor")

ALL: tuple[SearchAttributeKey, ...] = (KIND, STATE, REGION, NODE, TENANT, GPU_COUNT, ENDS_AT, EXPIRING, ACTOR)

_KINDS = {
    SearchAttributeIndexedValueType.INT: "Int",
    SearchAttributeIndexedValueType.DATETIME: "Datetime",
    SearchAttributeIndexedValueType.BOOL: "Bool",
}


def dev_server_flags() -> list[str]:
    """`--search-attribute Name=Type` flags for `temporal server start-dev`."""
    flags: list[str] = []
    for key in ALL:
        kind = _KINDS.get(key.indexed_value_type, "Keyword")
        flags += ["--search-attribute", f"{key.name}={kind}"]
    return flags
