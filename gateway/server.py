"""The node gateway: the only way a node agent reaches Temporal, and only for its own node's work.

    agent (node token in `authorization`) ──gRPC──► NodeGateway ──gRPC (the control plane's TLS)──► Temporal
                                                   │ 1. who: the node token -> its node (store/token_cache.py)
                                                   │ 2. what: rules.handling(method); refused -> PERMISSION_DENIED
                                                   │ 3. where: the request's namespace is Berth's; a poll names
                                                   │    the node's own queue
                                                   │ 4. tasks: tokens sealed to the node on the way out, opened
                                                   ▼    (and checked) on the way back in (seal.py)

Everything the SDK relies on passes through unchanged, so an agent keeps Temporal's semantics: long polls,
heartbeats (whose answer carries cancellation), retries, timeouts. The gateway keeps no state but its key: it can
be killed and restarted at any moment, or run as several replicas sharing the key.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message
from temporalio.api.enums.v1 import TaskQueueKind
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice import v1 as service

from gateway.rules import SERVICE, Handling, handling, node_queue, refusal
from gateway.seal import SealError, TaskTokenSeal
from store.db import AsyncSession, async_sessionmaker
from store.outage import ANY_DATABASE_ERROR
from store.token_cache import SWEEP_SECONDS, TokenCache
from store.tokens import Principal

log = logging.getLogger("berth.gateway")

# The request message of each call the gateway reads (the rest pass as bytes).
REQUESTS: dict[str, type[Message]] = {
    "DescribeNamespace": service.DescribeNamespaceRequest,
    "PollActivityTaskQueue": service.PollActivityTaskQueueRequest,
    "RecordActivityTaskHeartbeat": service.RecordActivityTaskHeartbeatRequest,
    "RespondActivityTaskCompleted": service.RespondActivityTaskCompletedRequest,
    "RespondActivityTaskFailed": service.RespondActivityTaskFailedRequest,
    "RespondActivityTaskCanceled": service.RespondActivityTaskCanceledRequest,
}
ANSWERED_HERE: dict[str, bytes] = {
    "ShutdownWorker": service.ShutdownWorkerResponse().SerializeToString(),
    "RecordWorkerHeartbeat": service.RecordWorkerHeartbeatResponse().SerializeToString(),
}
# Client metadata passed on to Temporal (the SDK's name and version, which the server checks); never the node token.
FORWARDED_METADATA = ("client-name", "client-version", "supported-server-versions")
MAX_POLLS_PER_NODE = 16  # an agent's worker keeps 5 open (the SDK's default); several workers a few more
MAX_IDENTITY = 120  # the SDK's worker identity (`pid@host`), kept after the node's name for operators to read


class Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class GatewayPolicy:
    """What this gateway serves: Berth's namespace and the prefix of node task queues (`berth.node.`)."""

    namespace: str
    queue_prefix: str


class NodeGateway(grpc.GenericRpcHandler):
    def __init__(
        self,
        upstream: grpc.aio.Channel,
        sessions: async_sessionmaker[AsyncSession],
        seal: TaskTokenSeal,
        policy: GatewayPolicy,
        tokens: TokenCache | None = None,
    ) -> None:
        self.upstream = upstream
        self.sessions = sessions
        self.seal = seal
        self.policy = policy
        self.tokens = tokens or TokenCache()
        self.tokens.on_revoked = self._cut_polls
        self._polls: dict[int, set[asyncio.Task[Any]]] = {}  # token id -> its open long polls
        self._cut: set[asyncio.Task[Any]] = set()  # polls ended because their token was revoked
        # The control plane's own token at Temporal where its authorizer is on (config/temporal_credentials.py),
        # kept fresh by `run_gateway`; never a node's.
        self.bearer: str | None = None

    async def keep_swept(self) -> None:
        """Sweep revocations every second even when no call comes in: an idle node's long polls last a minute,
        and a revoked token's must end within seconds (`_cut_polls`). Nothing ends this loop but its cancellation:
        a sweep that fails is tried again a second later (calls meanwhile find the cache stale and fail closed)."""
        while True:
            try:
                await self.tokens.sweep(self.sessions)
            except Exception as error:  # noqa: BLE001 - the database down, its pool exhausted: keep sweeping
                log.warning("cannot sweep revoked tokens now: %s", error)
            await asyncio.sleep(SWEEP_SECONDS)

    def _cut_polls(self, revoked: set[int]) -> None:
        for token_id in revoked & self._polls.keys():
            for poll in self._polls.pop(token_id):
                self._cut.add(poll)
                poll.cancel()

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method: str = handler_call_details.method  # type: ignore[attr-defined]

        async def behaviour(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
            return await self.call(method, request, context)

        return grpc.unary_unary_rpc_method_handler(behaviour)

    async def call(self, method: str, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        name = method.removeprefix(SERVICE)
        node = "?"
        try:
            metadata = context.invocation_metadata() or ()
            principal = await self._principal(metadata)
            node = principal.node or "?"
            how = handling(method)
            if how is Handling.REFUSE:
                raise Refused(grpc.StatusCode.PERMISSION_DENIED, refusal(method))
            if how is Handling.ANSWER_HERE:
                return ANSWERED_HERE[name]
            received = None if name == "GetSystemInfo" else self._parse(name, request)
            if received is not None and getattr(received, "namespace", None) != self.policy.namespace:
                namespace = getattr(received, "namespace", None)
                raise Refused(
                    grpc.StatusCode.PERMISSION_DENIED, f"namespace {namespace!r} is not served to node agents"
                )
            passed = self._rebuilt(name, node, received)
            if how is Handling.POLL:
                return await self._poll(principal.token_id, node, method, passed, context)
            return await self._forward(method, passed.SerializeToString(), context)
        except Refused as refused:
            if refused.code is not grpc.StatusCode.UNAVAILABLE:
                log.warning("refused %s from node %s: %s", name, node, refused.message)
            await context.abort(refused.code, refused.message)
        except grpc.aio.AioRpcError as error:  # Temporal's own answer (NotFound for a finished task, ...): as it is,
            # with its status details (the SDK reads them); grpc's server wants the trailers as a tuple of pairs
            await context.abort(error.code(), error.details() or "", tuple(error.trailing_metadata() or ()))
        raise AssertionError("unreachable: abort raises")

    async def _principal(self, metadata: Sequence[tuple[str, Any]]) -> Principal:
        """The node token that authorises this call; refused without a live node token."""
        token = next((str(v) for k, v in metadata if k == "authorization"), "")
        token = token.removeprefix("Bearer ").strip()
        if not token:
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, "send this node's token (`authorization: Bearer ...`)")
        try:
            principal = await self.tokens.principal(self.sessions, token)
        except ANY_DATABASE_ERROR as error:  # down, or its connection pool exhausted
            raise Refused(grpc.StatusCode.UNAVAILABLE, f"cannot verify the node token now: {error}") from None
        if principal is None:
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, "the node token is unknown or revoked")
        if principal.role != "node" or principal.node is None:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, "the node gateway serves node agents: use a node token")
        return principal

    def _parse(self, name: str, request: bytes) -> Message:
        message = REQUESTS[name]()
        try:
            message.ParseFromString(request)
        except DecodeError:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: the request does not decode") from None
        return message

    def _rebuilt(self, name: str, node: str, received: Message | None) -> Message:
        """The request passed on to Temporal, built afresh from the fields Berth's agents need: nothing else a node
        sends (worker deployment options, versioning, another worker's name, fields this gateway does not know)
        reaches Temporal, and the worker identity always names the node."""
        if received is None:
            return service.GetSystemInfoRequest()
        identity = f"{node}:{getattr(received, 'identity', '')[:MAX_IDENTITY]}"
        namespace = self.policy.namespace
        if isinstance(received, service.DescribeNamespaceRequest):
            return service.DescribeNamespaceRequest(namespace=namespace)
        if isinstance(received, service.PollActivityTaskQueueRequest):
            own = node_queue(self.policy.queue_prefix, node)
            if received.task_queue.name != own:
                raise Refused(
                    grpc.StatusCode.PERMISSION_DENIED, f"node {node} may poll only its own task queue {own!r}"
                )
            queue = TaskQueue(name=own, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL)
            return service.PollActivityTaskQueueRequest(namespace=namespace, task_queue=queue, identity=identity)
        token = self._open(node, received.task_token)  # type: ignore[attr-defined]
        if isinstance(received, service.RecordActivityTaskHeartbeatRequest):
            return service.RecordActivityTaskHeartbeatRequest(
                namespace=namespace, task_token=token, details=received.details, identity=identity
            )
        if isinstance(received, service.RespondActivityTaskCompletedRequest):
            return service.RespondActivityTaskCompletedRequest(
                namespace=namespace, task_token=token, result=received.result, identity=identity
            )
        if isinstance(received, service.RespondActivityTaskFailedRequest):
            return service.RespondActivityTaskFailedRequest(
                namespace=namespace,
                task_token=token,
                failure=received.failure,
                identity=identity,
                last_heartbeat_details=received.last_heartbeat_details,
            )
        if isinstance(received, service.RespondActivityTaskCanceledRequest):
            return service.RespondActivityTaskCanceledRequest(
                namespace=namespace, task_token=token, details=received.details, identity=identity
            )
        raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"{name} is not passed on")

    async def _poll(
        self,
        token_id: int,
        node: str,
        method: str,
        request: Message,
        context: grpc.aio.ServicerContext[bytes, bytes],
    ) -> bytes:
        polls = self._polls.setdefault(token_id, set())
        if len(polls) >= MAX_POLLS_PER_NODE:  # one host must not hold the namespace's pollers (Temporal limits them)
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, f"node {node} has {len(polls)} polls open already")
        # A long poll outlives many sweeps: when its token is revoked meanwhile, the sweep cuts it (`_cut_polls`),
        # and the agent is told to poll again (UNAVAILABLE, which the SDK retries with the token it holds now: a
        # rotated agent carries on, a revoked one is refused). A task that arrived just as the cut did is handed
        # over all the same: Temporal has started it, and dropping it would leave it to its timeout.
        poll = asyncio.current_task()
        assert poll is not None
        polls.add(poll)
        call = self._call(method, request.SerializeToString(), context)
        try:
            answered = await call
        except asyncio.CancelledError:
            if poll not in self._cut:
                raise  # the agent went away
            self._cut.discard(poll)
            poll.uncancel()
            if not call.done() or call.cancelled():
                raise Refused(grpc.StatusCode.UNAVAILABLE, "the node token was revoked: poll again") from None
            answered = await call  # Temporal had answered: the task (or an empty poll) goes to the agent
        finally:
            polls.discard(poll)
            if not polls:
                self._polls.pop(token_id, None)
        answer = service.PollActivityTaskQueueResponse()
        answer.ParseFromString(answered)
        if answer.task_token:
            answer.task_token = self.seal.seal(node, answer.task_token)
        return answer.SerializeToString()

    def _open(self, node: str, sealed: bytes) -> bytes:
        try:
            return self.seal.open(node, sealed)
        except SealError as error:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"node {node}: {error}") from None

    def _call(
        self, method: str, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> grpc.aio.UnaryUnaryCall[bytes, bytes]:
        """The call to Temporal, with the SDK's name and version (which the server checks), Berth's namespace and the
        control plane's own token when Temporal checks one; never the node's token or any other header it sent."""
        received = dict((k, v) for k, v in (context.invocation_metadata() or ()) if k in FORWARDED_METADATA)
        metadata = (*((k, str(v)) for k, v in received.items()), ("temporal-namespace", self.policy.namespace))
        if self.bearer is not None:
            metadata = (*metadata, ("authorization", f"Bearer {self.bearer}"))
        return self.upstream.unary_unary(method)(request, metadata=metadata, timeout=context.time_remaining())

    async def _forward(self, method: str, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return await self._call(method, request, context)  # type: ignore[no-any-return]
