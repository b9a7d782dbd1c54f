"""Cohort trees: Kueue's hierarchical cohorts (its Cohort objects with `parentName`), over one quota account, and
KAI-Scheduler's departments as a choice on a cohort (`quotaMode`).

A tenant in a cohort lends and borrows through it; a cohort may have a parent, and a quota of its own. Every node
of the tree, tenant or cohort, is an account with a nominal quota and optional borrowing and lending limits; the
numbers Kueue keeps for each (pkg/cache, resource_node.go) are, bottom-up:

    guaranteed(n)    subtree_quota(n) - lendingLimit(n) when it has one, else 0    what stays with n's subtree
    subtree_quota(n) tenant: its nominal quota
                     cohort: its own quota + sum over children c of (subtree_quota(c) - guaranteed(c))
    usage(n)         tenant: the GPUs it holds against the account
                     cohort: sum over children c of max(0, usage(c) - guaranteed(c))

and, top-down, how much more n may use:

    available(root)  subtree_quota(root) - usage(root)
    available(n)     max(0, guaranteed(n) - usage(n))                              its own part nobody draws
                   + min(available(parent(n)),                                     what its parent has left,
                         subtree_quota(n) - guaranteed(n)                          as far as its borrowing limit
                         - max(0, usage(n) - guaranteed(n)) + borrowingLimit(n))   reaches (unlimited when unset)

That is an `Additive` cohort, Kueue's: its own quota adds to what its members bring. A `Department` cohort is
KAI-Scheduler's department, whose quota is not more GPUs but a bound on what its projects use together (their own
quotas lie within it). Kueue's arithmetic has no such number, so a node may carry a bound of its own, and a
department is the node whose own quota is 0 and whose bound is its quota:

    bound(n)         a Department: its gpuQuota (on a product's account, its `quotas` entry for that product)
    total(n)         every GPU held in n's subtree, guaranteed parts included
    subtree_quota(n) as above, but at most bound(n): its subtree never uses more, so it puts no more in its parent
    available(n)     as above, but at most bound(m) - total(m) for n and every cohort m above it with a bound

So a department's members borrow from each other (and, through it, from its parent) until the department's
members together hold its quota, and not one GPU beyond it however much the parent has left: the department
behaves as a borrowing limit that caps its subtree's total use at its quota. Its members' quotas may add up to
more than its quota, as KAI allows (it divides a department's share among its projects; Run:ai's documentation
recommends, without requiring, a department quota at least their sum); then a member within its own quota may
still have to wait for the others.

A flat cohort (tenants naming a cohort no Cohort object defines) is a root with no quota of its own: this is then
exactly the one-level formula of `scheduler.quota.accounts`. A tenant in no cohort is a root by itself: its nominal
quota is a hard cap.

Pure: the caller gives the leaves (one account per tenant of the tree) and the fleet's cohorts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from contracts.vocabulary import CohortQuotaMode
from scheduler.views import CohortView, TenantView


@dataclass(frozen=True)
class Limits:
    """A cohort's quota on one account: its own nominal part, its limits (None: unlimited), and the most its whole
    subtree may hold together (`bound`: a Department's quota; None: no such bound)."""

    nominal: int = 0
    borrowing_limit: int | None = None
    lending_limit: int | None = None
    bound: int | None = None


@dataclass(frozen=True)
class FullDepartment:
    """A bounded cohort that a request would take beyond its bound: for the refusal's words."""

    cohort: str
    total: int  # what its members hold now
    bound: int


def path_to_root(cohort: str | None, cohorts: Mapping[str, CohortView]) -> tuple[str, ...]:
    """The cohort, its parent, ... up to its root (a cohort no Cohort object defines is a root of its own). A cycle,
    which the fleet's validation refuses, ends the walk where it closes."""
    path: list[str] = []
    while cohort is not None and cohort not in path:
        path.append(cohort)
        view = cohorts.get(cohort)
        cohort = view.parent if view is not None else None
    return tuple(path)


def root_of(cohort: str | None, cohorts: Mapping[str, CohortView]) -> str | None:
    path = path_to_root(cohort, cohorts)
    return path[-1] if path else None


def tree_members(
    tenant: TenantView, tenants: Iterable[TenantView], cohorts: Mapping[str, CohortView]
) -> list[TenantView]:
    """Every tenant of `tenant`'s cohort tree but itself (none when it is in no cohort)."""
    root = root_of(tenant.cohort, cohorts)
    if root is None:
        return []
    roots: dict[str, str | None] = {}
    members = []
    for other in tenants:
        if other.name == tenant.name or other.cohort is None:
            continue
        if other.cohort not in roots:
            roots[other.cohort] = root_of(other.cohort, cohorts)
        if roots[other.cohort] == root:
            members.append(other)
    return members


@dataclass(frozen=True)
class Leaf:
    """A tenant's account as the tree sees it."""

    tenant: str
    cohort: str | None
    nominal: int
    used: int
    borrowing_limit: int | None
    lending_limit: int | None


class CohortTree:
    """One account (a tenant's GPUs, or its GPUs of one product) of every tenant and cohort of one tree, with
    Kueue's numbers for each node. Nodes are ("tenant", name) and ("cohort", name): a tenant and a cohort may share
    a name."""

    def __init__(
        self, leaves: Iterable[Leaf], cohorts: Mapping[str, CohortView], limits_of: Callable[[CohortView], Limits]
    ) -> None:
        self.parent: dict[tuple[str, str], tuple[str, str] | None] = {}
        self.children: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self.limits: dict[tuple[str, str], Limits] = {}
        self.used: dict[tuple[str, str], int] = {}
        for leaf in leaves:
            node = ("tenant", leaf.tenant)
            self.limits[node] = Limits(leaf.nominal, leaf.borrowing_limit, leaf.lending_limit)
            self.used[node] = leaf.used
            self._attach(node, leaf.cohort, cohorts, limits_of)
        self._quota: dict[tuple[str, str], int] = {}
        self._usage: dict[tuple[str, str], int] = {}
        self._total: dict[tuple[str, str], int] = {}
        self._headroom: dict[tuple[str, str], int | None] = {}
        self._available: dict[tuple[str, str], int] = {}

    def _attach(
        self,
        node: tuple[str, str],
        cohort: str | None,
        cohorts: Mapping[str, CohortView],
        limits_of: Callable[[CohortView], Limits],
    ) -> None:
        """Hang `node` under `cohort`, and each cohort on the way up under its parent, once. A cycle (refused by
        the fleet's validation) ends the climb where it would close, as `path_to_root` does."""
        climbed: set[tuple[str, str]] = set()
        while cohort is not None and ("cohort", cohort) not in climbed:
            above = ("cohort", cohort)
            self.parent[node] = above
            self.children.setdefault(above, []).append(node)
            if above in self.parent:  # already hung, with everything above it
                return
            climbed.add(above)
            view = cohorts.get(cohort)
            self.limits[above] = limits_of(view) if view is not None else Limits()
            node, cohort = above, (view.parent if view is not None else None)
        self.parent[node] = None

    def guaranteed(self, node: tuple[str, str]) -> int:
        limit = self.limits[node].lending_limit
        return max(0, self.subtree_quota(node) - limit) if limit is not None else 0

    def subtree_quota(self, node: tuple[str, str]) -> int:
        """What the node's subtree puts in its parent: its own quota and its children's lendable parts, no more than
        its bound (a department's members could never use more together)."""
        if node not in self._quota:
            limits = self.limits[node]
            value = limits.nominal + sum(
                self.subtree_quota(c) - self.guaranteed(c) for c in self.children.get(node, ())
            )
            self._quota[node] = value if limits.bound is None else min(value, limits.bound)
        return self._quota[node]

    def usage(self, node: tuple[str, str]) -> int:
        if node not in self._usage:
            if node[0] == "tenant":
                self._usage[node] = self.used[node]
            else:
                self._usage[node] = sum(max(0, self.usage(c) - self.guaranteed(c)) for c in self.children.get(node, ()))
        return self._usage[node]

    def total(self, node: tuple[str, str]) -> int:
        """Every GPU held below the node, guaranteed parts included: what a bound counts."""
        if node not in self._total:
            own = self.used.get(node, 0)
            self._total[node] = own + sum(self.total(c) for c in self.children.get(node, ()))
        return self._total[node]

    def headroom(self, node: tuple[str, str]) -> int | None:
        """The least room any bound leaves, of the node's own and those of the cohorts above it (None: no bound on
        the way up). A bound caps its whole subtree, a member's guaranteed part included, so it is checked at every
        level rather than only where Kueue's borrowing passes through it."""
        if node not in self._headroom:
            bound = self.limits[node].bound
            own = bound - self.total(node) if bound is not None else None
            parent = self.parent.get(node)
            above = self.headroom(parent) if parent is not None else None
            self._headroom[node] = min((r for r in (own, above) if r is not None), default=None)
        return self._headroom[node]

    def full_department(self, node: tuple[str, str], extra: int) -> FullDepartment | None:
        """The nearest bounded cohort above `node` that `extra` more GPUs would take beyond its bound, if any."""
        for above in self.ancestors(node):
            bound = self.limits[above].bound
            if bound is not None and self.total(above) + extra > bound:
                return FullDepartment(above[1], self.total(above), bound)
        return None

    def available(self, node: tuple[str, str]) -> int:
        """How much more `node` may use: Kueue's `available`, within every bound on the way up (the module
        docstring)."""
        if node not in self._available:
            parent = self.parent.get(node)
            if parent is None:
                value = self.subtree_quota(node) - self.usage(node)
            else:
                guaranteed, usage = self.guaranteed(node), self.usage(node)
                from_parent = self.available(parent)
                limit = self.limits[node].borrowing_limit
                if limit is not None:
                    stored = self.subtree_quota(node) - guaranteed
                    from_parent = min(from_parent, stored - max(0, usage - guaranteed) + limit)
                value = max(0, guaranteed - usage) + from_parent
            room = self.headroom(node)
            self._available[node] = value if room is None else min(value, room)
        return self._available[node]

    def usage_with(self, node: tuple[str, str], extra: int) -> dict[tuple[str, str], int]:
        """The usage of `node` and of each cohort above it were `node` to use `extra` more: each level passes up
        only what goes beyond its child's guaranteed part, as Kueue's addUsage does."""
        result = {node: self.usage(node) + extra}
        child = node
        for above in self.ancestors(node):
            guaranteed = self.guaranteed(child)
            grown = max(0, result[child] - guaranteed) - max(0, self.usage(child) - guaranteed)
            result[above] = self.usage(above) + grown
            child = above
        return result

    def borrowing(self, node: tuple[str, str]) -> bool:
        """Whether the node uses more than its subtree's quota: it draws on its parent beyond what it put there."""
        return self.usage(node) > self.subtree_quota(node)

    def ancestors(self, node: tuple[str, str]) -> list[tuple[str, str]]:
        """Its parent, grandparent, ... to the root."""
        result = []
        above = self.parent.get(node)
        while above is not None:
            result.append(above)
            above = self.parent.get(above)
        return result

    def lowest_common_ancestor(self, a: tuple[str, str], b: tuple[str, str]) -> tuple[str, str] | None:
        mine = self.ancestors(a)
        return next((c for c in self.ancestors(b) if c in mine), None)

    def child_towards(self, ancestor: tuple[str, str], node: tuple[str, str]) -> tuple[str, str]:
        """The child of `ancestor` on the way down to `node`."""
        while self.parent.get(node) != ancestor:
            above = self.parent.get(node)
            assert above is not None, f"{ancestor} is not above {node}"
            node = above
        return node


def _in_mode(cohort: CohortView, quota: int, borrowing_limit: int | None, lending_limit: int | None) -> Limits:
    """A cohort's `quota` on one account as its quota mode reads it: GPUs of its own (Additive), or the bound on
    its subtree with none of its own (Department)."""
    if cohort.quota_mode is CohortQuotaMode.DEPARTMENT:
        return Limits(0, borrowing_limit, lending_limit, bound=quota)
    return Limits(quota, borrowing_limit, lending_limit)


def total_limits(cohort: CohortView) -> Limits:
    """A cohort's quota on its members' GPUs in total. A department given only per-product `quotas` bounds the
    total by their sum: what it names is all its members may hold together."""
    quota = cohort.gpu_quota
    if cohort.quota_mode is CohortQuotaMode.DEPARTMENT and not quota:
        quota = sum(q.nominal for q in cohort.quotas)
    return _in_mode(cohort, quota, cohort.borrowing_limit, cohort.lending_limit)


def flavor_limits(product: str, region: str | None) -> Callable[[CohortView], Limits]:
    """A cohort's quota for one product (and region): its `quotas` entry for it, or none of its own (a department
    without one bounds that product only through its total)."""
    key = (product.casefold(), region)

    def limits(cohort: CohortView) -> Limits:
        same = next((q for q in cohort.quotas if (q.product.casefold(), q.region) == key), None)
        if same is None:
            return Limits()
        return _in_mode(cohort, same.nominal, same.borrowing_limit, same.lending_limit)

    return limits
