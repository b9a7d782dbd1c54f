"""Schemathesis hooks for Berth: what its runs check beyond the built-in checks. Loaded by
tests/api/test_api_schemathesis.py, and by hand with

    SCHEMATHESIS_HOOKS=tests.api.schemathesis_hooks schemathesis run URL/openapi.json --checks all \\
        --exclude-checks positive_data_acceptance,use_after_free -H "Authorization: Bearer <token>"

The built-in `positive_data_acceptance` expects every request the schema calls valid to be accepted. A schema says
what is well formed, not what exists or fits together: a region, pool, product, node, GPU, tenant or PriorityClass the fleet does not
have, a selector that does not compile as CEL, a request no host could ever hold, a report for another topology, a
cursor the API did not hand out, a manifest naming another deployment than its address, a fleet file whose
documents do not fit together, pinned GPUs that do not match `gpu_count` and the one pinned node, an admin's create
that names no tenant. The API refuses those with codes (and, under
`invalid_request`, problem types) that say which; `well_formed_requests_refused_only_for_what_they_name` is
`positive_data_acceptance` with exactly those refusals allowed, so a schema-valid request refused for its shape
still fails the run.

`use_after_free` is left out: it expects a resource to be gone after a successful DELETE, while `DELETE
/v1/allocations/{id}` releases the allocation, which stays readable as `released` (docs/design.md section 6).
"""

from __future__ import annotations

import json
import re
from typing import Any

import schemathesis
from schemathesis.specs.openapi.checks import positive_data_acceptance

from contracts.durations import DURATION_PATTERN

# Codes that refuse a well-formed request for what it names or how its parts fit together (api/README.md).
NAMED_REFUSALS = frozenset(
    {
        "unknown_region",
        "unknown_product",
        "unknown_node",
        "unknown_gpu",
        "unknown_tenant",
        "unknown_pool",
        "unknown_priority_class",
        "invalid_selector",
        "selector_cost_exceeded",
        "unsatisfiable",
        "topology_mismatch",
        "invalid_cursor",
        "invalid_fleet",
    }
)
# Problem types under `invalid_request` that no schema can state: a deployment manifest naming another deployment or
# namespace than its address, a CEL selector in it that does not compile, a rule between a manifest's fields
# (`manifest_rule`: unique names, a serving unit's roles; fleet/deployment.py), pinned GPUs that are not as many as
# `gpu_count` on exactly one pinned node (a rule between fields), an allocation's end or a reservation's window that
# is not in the future (rules against the clock), a pool filter outside the region filter (`pool_region`), a duration
# past its field's bounds (`duration_out_of_range`: a pattern cannot bound the sum of `1h30m`'s parts), user-data
# that is not a YAML mapping or sets a key the VM's seed sets itself (what text says is no schema's to state), or
# that is over 64 KiB in UTF-8 though within the schema's maxLength (which counts characters), a token's role and
# scope that do not go together (`token_scope`: a rule between fields).
NAMED_PROBLEMS = frozenset(
    {
        "name_mismatch",
        "namespace_mismatch",
        "cel_compile_error",
        "manifest_rule",
        "gpu_pins",
        "ends_at_past",
        "window",
        "pool_region",
        "duration_out_of_range",
        "user_data_yaml",
        "user_data_not_mapping",
        "user_data_reserved_key",
        "user_data_too_large",
        "token_scope",
    }
)
# `invalid_request` on these fields alone depends on the token, not the body: an admin must name the tenant.
TOKEN_DEPENDENT_FIELDS = frozenset({"body.tenant"})


def _named_refusal(error: dict[str, Any]) -> bool:
    if error.get("code") in NAMED_REFUSALS:
        return True
    problems = error.get("details")
    if error.get("code") != "invalid_request" or not isinstance(problems, list) or not problems:
        return False
    return all(
        isinstance(p, dict) and (p.get("type") in NAMED_PROBLEMS or p.get("field") in TOKEN_DEPENDENT_FIELDS)
        for p in problems
    )


@schemathesis.check
def well_formed_requests_refused_only_for_what_they_name(ctx: Any, response: Any, case: Any) -> bool | None:
    """`positive_data_acceptance`, allowing the refusals of a well-formed request that no schema can rule out."""
    if response.status_code in (400, 422):
        try:
            error = json.loads(response.content)["error"]
        except (ValueError, KeyError, TypeError):
            error = None
        if isinstance(error, dict) and _named_refusal(error):
            return None
    return positive_data_acceptance(ctx, response, case)


@schemathesis.hook
def map_query(ctx: Any, query: Any) -> Any:
    """A long poll (`wait_for`, api/long_poll.py) waits up to its `timeout`, 30s when it names none: a run would spend
    minutes waiting. A well-formed timeout, or none, becomes `0` (answer at once), which keeps a valid request valid
    and an invalid one invalid."""
    if isinstance(query, dict) and "wait_for" in query:
        timeout = query.get("timeout")
        if timeout is None or (isinstance(timeout, str) and re.fullmatch(DURATION_PATTERN, timeout)):
            query["timeout"] = "0"
    return query


@schemathesis.hook
def map_path_parameters(ctx: Any, path_parameters: Any) -> Any:
    """`DELETE /v1/tokens/{token_id}` with a small id would revoke the very token the run calls with: a well-formed
    id becomes one no token has (a 404), so the run keeps its token."""
    operation = getattr(ctx, "operation", None)
    if getattr(operation, "path", None) == "/v1/tokens/{token_id}" and isinstance(path_parameters, dict):
        token_id = path_parameters.get("token_id")
        if isinstance(token_id, int) and not isinstance(token_id, bool) and 1 <= token_id <= 2**31 - 1:
            path_parameters["token_id"] = 2**31 - 1
    return path_parameters
