"""The capability filter (docs/seeds.md, "Capabilities a pool must offer"): a pool serves a member only if its class
offers every capability required.

Requirements come from the deployment (`spec.template.spec.requirements`, Seldon's `spec.requirements`) and from a
member's `resources.backend` (docs/seeds.md, "Filter policies that name their reason": a pool must support the
backend it would run).
"""

from __future__ import annotations

from fleet.inference_class import InferenceClass


def missing_capabilities(required: frozenset[str], inference_class: InferenceClass) -> str | None:
    """Why the class falls short, or None when it offers everything required."""
    missing = sorted(required - set(inference_class.spec.capabilities))
    if not missing:
        return None
    offered = ", ".join(inference_class.spec.capabilities) or "none"
    return f"class {inference_class.metadata.name} lacks capability {', '.join(missing)} (offers {offered})"
