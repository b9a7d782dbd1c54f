"""Draining (docs/seeds.md, "Draining moves replicas one at a time"): a cluster being deleted or marked draining, or
a draining pool, takes no new replicas, and its replicas move elsewhere one at a time, each removed only once a
ready replica elsewhere has taken its place."""

from __future__ import annotations

from contracts.fleet_plan import ClusterReason, DropReason
from tests.scheduler.deployment.builders import (
    classes,
    cluster,
    deployment,
    gpu,
    inference_class,
    plan,
    product_is,
    replica,
    standalone,
)

H100 = inference_class("h100-8x", gpu("H100"))
KNOWN = classes(H100)
READY = [{"type": "Ready", "status": "True", "reason": "Available"}]
STARTING = [{"type": "Ready", "status": "False", "reason": "Creating"}]
DRAINING = {"berth.dev/draining": "true"}


def llama(replicas: int = 2) -> object:
    return deployment("llama", standalone("serve", product_is("H100")), replicas=replicas)


def on(cluster_name: str, index: int, conditions: list[dict[str, str]], pool: str = "h100") -> object:
    return replica("llama", cluster_name, index, [("serve", 1, [("Standalone", pool, True)])], conditions=conditions)


def fleet(**a: object) -> list[object]:
    return [cluster("a", [("h100", "h100-8x", 8)], **a), cluster("b", [("h100", "h100-8x", 8)])]  # type: ignore[arg-type]


def summary(result: object) -> tuple[list[tuple[str, int, str]], list[tuple[str, str]]]:
    kept = [(r.cluster, r.index, r.origin) for r in result.replicas]  # type: ignore[attr-defined]
    dropped = [(d.name, d.reason) for d in result.dropped]  # type: ignore[attr-defined]
    return kept, dropped


def test_replicas_move_off_a_draining_cluster_one_at_a_time_never_below_what_serves() -> None:
    clusters = fleet(annotations=DRAINING)
    # 1. Both serve on a: both stay, one replacement is placed on b.
    first = plan(llama(), clusters, KNOWN, [on("a", 0, READY), on("a", 1, READY)])
    assert summary(first) == ([("a", 0, "retained"), ("a", 1, "retained"), ("b", 0, "new")], [])
    assert first.status.message.endswith(
        "moving 2 replicas one at a time: llama-a-0 (cluster a is marked draining (berth.dev/draining)); "
        "llama-a-1 (cluster a is marked draining (berth.dev/draining))"
    )
    # 2. The replacement is still starting: nothing moves, nothing new.
    second = plan(llama(), clusters, KNOWN, [on("a", 0, READY), on("a", 1, READY), on("b", 0, STARTING)])
    assert summary(second) == ([("a", 0, "retained"), ("a", 1, "retained"), ("b", 0, "retained")], [])
    # 3. It is ready: one replica on a goes, the next replacement is placed.
    third = plan(llama(), clusters, KNOWN, [on("a", 0, READY), on("a", 1, READY), on("b", 0, READY)])
    assert summary(third) == (
        [("a", 0, "retained"), ("b", 0, "retained"), ("b", 1, "new")],
        [("llama-a-1", DropReason.DRAINED)],
    )
    assert third.dropped[0].message == (
        "cluster a is marked draining (berth.dev/draining): ready replicas elsewhere took its place"
    )
    # 4. Both ready on b: the last one on a goes.
    last = plan(llama(), clusters, KNOWN, [on("a", 0, READY), on("b", 0, READY), on("b", 1, READY)])
    assert summary(last) == ([("b", 0, "retained"), ("b", 1, "retained")], [("llama-a-0", DropReason.DRAINED)])
    assert last.status.message.endswith("moved every replica off draining capacity")


def test_a_cluster_being_deleted_takes_no_new_replica_and_says_why() -> None:
    clusters = fleet(deletion_timestamp="2026-11-26T10:00:00Z")
    result = plan(llama(replicas=3), clusters[:1], KNOWN)
    assert result.replicas == []
    verdict = result.status.clusters[0]
    assert (verdict.reason, verdict.message) == (
        ClusterReason.DRAINING,
        "cluster a is being deleted (since 2026-11-26T10:00:00Z)",
    )


def test_a_replica_not_ready_on_a_draining_cluster_goes_first_and_the_ready_one_serves_until_replaced() -> None:
    result = plan(llama(replicas=1), fleet(annotations=DRAINING), KNOWN, [on("a", 0, STARTING), on("a", 1, READY)])
    # one replica is wanted and none is ready elsewhere: the ready one on a is still needed, the starting one is not
    assert summary(result) == ([("a", 1, "retained"), ("b", 0, "new")], [("llama-a-0", DropReason.DRAINED)])


def test_a_draining_pool_moves_its_replicas_to_another_pool_and_takes_no_new_one() -> None:
    two_pools = cluster(
        "a", [("old", "h100-8x", 8), ("new", "h100-8x", 8)], annotations={"berth.dev/draining-pools": "old"}
    )
    result = plan(llama(replicas=1), [two_pools], KNOWN, [on("a", 0, READY, pool="old")])
    assert [(r.cluster, r.index, r.origin, r.engines[0].members[0].pool) for r in result.replicas] == [
        ("a", 0, "retained", "old"),
        ("a", 1, "new", "new"),
    ]
    assert "llama-a-0 (pool old of cluster a draining)" in result.status.message


def test_without_draining_nothing_moves() -> None:
    result = plan(llama(), fleet(), KNOWN, [on("a", 0, READY), on("a", 1, READY)])
    assert summary(result) == ([("a", 0, "retained"), ("a", 1, "retained")], [])
    assert "moving" not in result.status.message
