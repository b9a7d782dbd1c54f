"""Fair sharing: Kueue's, switched on per cohort tree (`fairSharing.enabled` on its root Cohort; off by default).

A node of a cohort tree (a tenant, or a cohort) has a dominant resource share (Kueue's DRS, pkg/cache fair_sharing.go)
over its GPU quota account:

    borrowed(n)   max(0, usage(n) - subtree_quota(n))              what it uses beyond what it puts in the tree
    lendable(n)   potential(parent(n)), where                         what its parent's tree could ever give
                  potential(root) = subtree_quota(root)
                  potential(c)    = min(guaranteed(c) + potential(parent(c)), subtree_quota(c) + borrowingLimit(c))
    share(n)      borrowed(n) / lendable(n) / weight(n)               0 when it borrows nothing (and at a root)
                  weight 0 and borrowing: after every weighted share (two of those compare unweighted)

Admission, where a tree shares fairly, is Kueue's tournament (pkg/scheduler fair_sharing_iterator.go): at each
cohort, from the leaves up, the candidates of its children (each tenant's next request, each child cohort's winner)
are compared by the share the child would have with that request admitted: a request that would not borrow first,
then the smaller share, then the higher priority, then the earlier arrival. Preemption's fair strategies are in
`scheduler.preemption`.

Pure: shares are computed on a `scheduler.cohorts.CohortTree` of the total GPU account.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduler import quota
from scheduler.cohorts import CohortTree, root_of, tree_members
from scheduler.views import CohortView, TenantView

Node = tuple[str, str]


@dataclass(frozen=True, order=True)
class Share:
    """A comparable share: weighted ones first by value; weight-0 borrowers after them, by their unweighted value."""

    unweighted_last: bool
    value: float

    @property
    def shown(self) -> float | None:
        """For people: the weighted share, None for a weight-0 borrower (always last)."""
        return None if self.unweighted_last else self.value


NONE = Share(False, 0.0)


def shares_fairly(tenant: TenantView, cohorts: Mapping[str, CohortView]) -> bool:
    """Whether the tenant's cohort tree decides by fair sharing (its root Cohort has it enabled)."""
    root = root_of(tenant.cohort, cohorts)
    return root is not None and root in cohorts and cohorts[root].fair_sharing


def tree(tenant: TenantView, tenants: Iterable[TenantView], cohorts: Mapping[str, CohortView],
         extra: int = 0) -> CohortTree:  # fmt: skip
    """The tenant's cohort tree over GPUs in total, with `extra` more GPUs charged to it (a request admitted)."""
    own = quota.total_account(tenant)
    if extra:
        own = dataclasses.replace(own, used=own.used + extra)
    members = [quota.total_account(m) for m in tree_members(tenant, tenants, cohorts)]
    return quota.tree_of(own, members, cohorts)


def weight_of(node: Node, tenants: Mapping[str, TenantView], cohorts: Mapping[str, CohortView]) -> float:
    kind, name = node
    if kind == "tenant":
        view = tenants.get(name)
        return view.weight if view is not None else 1.0
    cohort = cohorts.get(name)
    return cohort.weight if cohort is not None else 1.0


def potential(tree: CohortTree, node: Node) -> int:
    """What `node` could ever have, were everyone else idle: Kueue's potentialAvailable."""
    parent = tree.parent.get(node)
    if parent is None:
        return tree.subtree_quota(node)
    value = tree.guaranteed(node) + potential(tree, parent)
    limit = tree.limits[node].borrowing_limit
    if limit is not None:
        value = min(value, tree.subtree_quota(node) + limit)
    return value


def share(tree: CohortTree, node: Node, weight: float) -> Share:
    parent = tree.parent.get(node)
    if parent is None:
        return NONE
    borrowed = tree.usage(node) - tree.subtree_quota(node)
    if borrowed <= 0:
        return NONE
    lendable = potential(tree, parent)
    ratio = borrowed / lendable if lendable > 0 else 0.0
    if weight == 0:
        return Share(True, ratio)
    return Share(False, ratio / weight)


def tenant_share(tenant: TenantView, tenants: Iterable[TenantView], cohorts: Mapping[str, CohortView]) -> Share:
    """The tenant's own share in its tree now (NONE outside a cohort)."""
    if tenant.cohort is None:
        return NONE
    return share(tree(tenant, tenants, cohorts), ("tenant", tenant.name), tenant.weight)


@dataclass(frozen=True)
class Contender:
    """A tenant's next queued request in the tournament: its size, priority and place in arrival order."""

    tenant: str
    gpus: int
    priority: int
    arrival: int


def tournament(contenders: Iterable[Contender], tenants: Mapping[str, TenantView],
               cohorts: Mapping[str, CohortView]) -> Contender | None:  # fmt: skip
    """The request a fair-sharing tree admits next, of its tenants' next requests (all of one tree): at each cohort,
    from the leaves up, the best of its children's candidates by (would not borrow, share with it admitted, higher
    priority, earlier arrival), the share being the child's (the tenant, or the child cohort it comes through)."""
    contenders = list(contenders)
    if not contenders:
        return None
    scored: list[tuple[Contender, CohortTree]] = [
        (c, tree(tenants[c.tenant], tenants.values(), cohorts, extra=c.gpus)) for c in contenders
    ]
    layout = scored[0][1]  # the tree's shape is the same in every scored copy

    def winner(node: Node) -> tuple[Contender, CohortTree] | None:
        best: tuple[tuple[object, ...], tuple[Contender, CohortTree]] | None = None
        for child in layout.children.get(node, ()):
            if child[0] == "tenant":
                found = next((pair for pair in scored if pair[0].tenant == child[1]), None)
            else:
                found = winner(child)
            if found is None:
                continue
            contender, its_tree = found
            child_share = share(its_tree, child, weight_of(child, tenants, cohorts))
            borrows = its_tree.usage(child) > its_tree.subtree_quota(child)
            key = (borrows, child_share, -contender.priority, contender.arrival)
            if best is None or key < best[0]:
                best = (key, found)
        return best[1] if best is not None else None

    root = layout.ancestors(("tenant", contenders[0].tenant))
    top = root[-1] if root else None
    if top is None:
        return contenders[0]
    found = winner(top)
    return found[0] if found is not None else None


__all__ = ["NONE", "Contender", "Share", "shares_fairly", "share", "tenant_share", "tournament"]
