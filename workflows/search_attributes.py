"""The custom search attributes that let operators list and filter Berth's work in the Temporal UI.

Registered by `berth up` and by the test fixtures; workers check they exist at start-up so a production server that
lacks them fails loudly instead of silently dropping visibility.
"""

from __future__ import annotations

from temporalio.common import SearchAttributeIndexedValueType, SearchAttributeKey

KIND: SearchAttributeKey[str] = SearchAttributeKey.for_keyword("BerthKind")
STATE: SearchAttributeKey[str] = SearchAttributeKey.for_keyword("BerthState")
REGION: SearchAttributeKey[str] = SearchAttributeKey.for_keyword("BerthRegion")
NODE: SearchAttributeKey[str] = SearchAttributeKey.for_keyword("BerthNode")
TENANT: SearchAttributeKey[str] = SearchAttributeKey.for_keyword("BerthTenant")
GPU_COUNT: SearchAttributeKey[int] = SearchAttributeKey.for_int("BerthGpuCount")

ALL: tuple[SearchAttributeKey, ...] = (KIND, STATE, REGION, NODE, TENANT, GPU_COUNT)


def dev_server_flags() -> list[str]:
    """`--search-attribute Name=Type` flags for `temporal server start-dev`."""
    flags: list[str] = []
    for key in ALL:
        kind = "Int" if key.indexed_value_type == SearchAttributeIndexedValueType.INT else "Keyword"
        flags += ["--search-attribute", f"{key.name}={kind}"]
    return flags
