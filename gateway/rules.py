"""What a node agent may ask of Temporal, and nothing more: the node gateway's policy, as pure functions.

A node agent is an activity-only worker on its own task queue (`berth.node.<node>`). To do that work the SDK needs
five calls: poll the queue, heartbeat a task, and complete, fail or cancel it; plus `GetSystemInfo` on connecting
and `DescribeNamespace` when a worker starts. Every other call of Temporal's WorkflowService (start, signal,
update, cancel, terminate, describe, list, read a history, the `...ById` answers that need no task token, ...)
is refused: a GPU host runs tenants' VMs, and one compromised host must not become a compromised control plane.
Two bookkeeping calls of newer SDKs (`ShutdownWorker`, `RecordWorkerHeartbeat`) speak of workers, not of work;
the gateway answers them itself (empty) so that nothing a node says about workers reaches Temporal.

The model is Kubernetes' Node authorizer: a kubelet's credential reaches only what belongs to its own node.
"""

from __future__ import annotations

from enum import StrEnum

SERVICE = "/temporal.api.workflowservice.v1.WorkflowService/"


class Handling(StrEnum):
    FORWARD = "forward"  # passed on as it is (after the namespace check)
    POLL = "poll"  # the node's own queue only; the task token in the answer is sealed to the node
    ANSWER = "answer"  # carries a sealed task token: must be this node's, unsealed before it is passed on
    ANSWER_HERE = "answer_here"  # answered by the gateway itself with an empty response
    REFUSE = "refuse"


METHODS: dict[str, Handling] = {
    "GetSystemInfo": Handling.FORWARD,
    "DescribeNamespace": Handling.FORWARD,
    "PollActivityTaskQueue": Handling.POLL,
    "RecordActivityTaskHeartbeat": Handling.ANSWER,
    "RespondActivityTaskCompleted": Handling.ANSWER,
    "RespondActivityTaskFailed": Handling.ANSWER,
    "RespondActivityTaskCanceled": Handling.ANSWER,
    "ShutdownWorker": Handling.ANSWER_HERE,
    "RecordWorkerHeartbeat": Handling.ANSWER_HERE,
}


def handling(method: str) -> Handling:
    """How the gateway treats a gRPC method path such as `/temporal.api.workflowservice.v1.WorkflowService/Poll..`."""
    if not method.startswith(SERVICE):
        return Handling.REFUSE
    return METHODS.get(method.removeprefix(SERVICE), Handling.REFUSE)


def node_queue(prefix: str, node: str) -> str:
    return f"{prefix}{node}"


def refusal(method: str) -> str:
    name = method.removeprefix(SERVICE)
    return (
        f"a node agent may not call {name}: through the node gateway it polls its own task queue and answers "
        "the tasks it was given, nothing else"
    )
