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
`scheduler.admission.preemption`.

A tree whose root sets `usageHalfLife` compares, wherever a share is compared for order (the tournament, and which
tenant preemption takes from first), each node's decayed GPU-seconds (its tenants', `scheduler.quota.usage_decay`) over
its weight instead (`usage_share`; weight 0: always last): what it used lately, not only what it holds now. Whether
preemption may take an allocation at all (Kueue's strategies) still compares the shares of what is held.

Pure: shares are computed on a `scheduler.quota.cohorts.CohortTree` of the total GPU account.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduler.quota.cohorts import CohortTree, root_of
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


def share(tree: CohortTree, node: Node, weight: float, usage: int | None = None) -> Share:
    """The node's share (`usage`: what it would use instead of what it uses now)."""
    parent = tree.parent.get(node)
    if parent is None:
        return NONE
    borrowed = (tree.usage(node) if usage is None else usage) - tree.subtree_quota(node)
    if borrowed <= 0:
        return NONE
    lendable = potential(tree, parent)
    ratio = borrowed / lendable if lendable > 0 else 0.0
    if weight == 0:
        return Share(True, ratio)
    return Share(False, ratio / weight)


def tenant_share(tree: CohortTree, tenant: TenantView) -> Share:
    """The tenant's own share in its tree now (`tree`: its cohort tree; NONE outside a cohort)."""
    if tenant.cohort is None:
        return NONE
    return share(tree, ("tenant", tenant.name), tenant.weight)


def remembered_usage(tree: CohortTree, node: Node, tenants: Mapping[str, TenantView]) -> dict[Node, float] | None:
    """Every node of the tree above `node`, and below its root, with its decayed GPU-seconds (a tenant's own; a
    cohort's, its tenants' summed), in one walk; None where the tree does not remember usage (a tenant's
    `decayed_usage` is unknown). Computed once per comparison round, so ordering stays linear in the tree's size."""
    above = tree.ancestors(node)
    root = above[-1] if above else node
    totals: dict[Node, float] = {}
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        current, done = stack.pop()
        if current[0] == "tenant":
            view = tenants.get(current[1])
            if view is None or view.decayed_usage is None:
                return None
            totals[current] = view.decayed_usage
        elif done:
            totals[current] = sum(totals[child] for child in tree.children.get(current, ()))
        else:
            stack.append((current, True))
            stack.extend((child, False) for child in tree.children.get(current, ()))
    return totals


def usage_share(
    remembered: Mapping[Node, float], node: Node, tenants: Mapping[str, TenantView], cohorts: Mapping[str, CohortView]
) -> Share:
    """The node's decayed GPU-seconds over its weight; weight 0: after every weighted one, even having used nothing.

    Kueue's admission fair sharing counts usage over a weight of 0 as infinite (pkg/util/admissionfairsharing,
    `CalculateUsage`), so a weight-0 LocalQueue that has used nothing still goes after one of weight 1 that has used
    nothing either (pkg/scheduler/scheduler_afs_test.go, "does not prioritize a zero-weight localqueue"). A share of
    what is held puts weight 0 last only while it borrows (`share`, as Kueue's DRS does); usage is not borrowing,
    and counting none as 0 let an idle weight-0 tenant win on arrival. Two weight-0 nodes compare by their usage."""
    total = remembered.get(node, 0.0)
    weight = weight_of(node, tenants, cohorts)
    if weight == 0:
        return Share(True, total)
    return Share(False, total / weight)


def ordering_share(
    tree: CohortTree,
    node: Node,
    tenants: Mapping[str, TenantView],
    cohorts: Mapping[str, CohortView],
    remembered: Mapping[Node, float] | None,
    usage: int | None = None,
) -> Share:
    """What orders the node among its siblings: its decayed usage over its weight where its tree remembers usage
    (`remembered`, from `remembered_usage`), else its share (`usage`: what it would hold instead of now)."""
    if remembered is not None:
        return usage_share(remembered, node, tenants, cohorts)
    return share(tree, node, weight_of(node, tenants, cohorts), usage)


@dataclass(frozen=True)
class Contender:
    """A tenant's next queued request in the tournament: its size, priority and place in arrival order."""

    tenant: str
    gpus: int
    priority: int
    arrival: int


def tournament(
    contenders: Iterable[Contender],
    tree: CohortTree,
    tenants: Mapping[str, TenantView],
    cohorts: Mapping[str, CohortView],
) -> Contender | None:
    """The request a fair-sharing tree admits next, of its tenants' next requests (`tree`: their cohort tree as it
    is): at each cohort, from the leaves up, the best of its children's candidates by (would not borrow, share with
    it admitted, higher priority, earlier arrival), the share being the child's (the tenant, or the child cohort
    it comes through); where the tree remembers usage, its decayed usage over its weight instead."""
    by_tenant = {c.tenant: c for c in contenders}
    if not by_tenant:
        return None
    usages = {name: tree.usage_with(("tenant", name), c.gpus) for name, c in by_tenant.items()}
    remembered = remembered_usage(tree, ("tenant", next(iter(by_tenant))), tenants)

    def winner(node: Node) -> Contender | None:
        best: tuple[tuple[object, ...], Contender] | None = None
        for child in tree.children.get(node, ()):
            found = by_tenant.get(child[1]) if child[0] == "tenant" else winner(child)
            if found is None:
                continue
            usage = usages[found.tenant][child]
            child_share = ordering_share(tree, child, tenants, cohorts, remembered, usage)
            key = (usage > tree.subtree_quota(child), child_share, -found.priority, found.arrival)
            if best is None or key < best[0]:
                best = (key, found)
        return best[1] if best is not None else None

    first = next(iter(by_tenant))
    above = tree.ancestors(("tenant", first))
    return winner(above[-1]) if above else by_tenant[first]


__all__ = [
    "NONE",
    "Contender",
    "Share",
    "ordering_share",
    "remembered_usage",
    "share",
    "shares_fairly",
    "tenant_share",
    "tournament",
    "usage_share",
    "weight_of",
]
