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
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from temporalio.api.workflowservice import v1 as service

from gateway.rules import SERVICE, Handling, handling, node_queue, refusal
from gateway.seal import SealError, TaskTokenSeal
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
FORWARDED_METADATA = ("client-name", "client-version", "supported-server-versions", "temporal-namespace")


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

    async def keep_swept(self) -> None:
        """Sweep revocations every second even when no call comes in: an idle node's long polls last a minute,
        and a revoked token's must end within seconds (`_cut_polls`)."""
        while True:
            try:
                await self.tokens.sweep(self.sessions)
            except (OSError, OperationalError, DBAPIError) as error:
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
            if how is Handling.FORWARD:
                self._check_namespace(name, request)
                return await self._forward(method, request, metadata, context)
            message = self._parse(name, request)
            self._check_namespace(name, message)
            if how is Handling.POLL:
                return await self._poll(principal.token_id, node, method, message, metadata, context)
            message.task_token = self._open(node, message.task_token)  # type: ignore[attr-defined]
            return await self._forward(method, message.SerializeToString(), metadata, context)
        except Refused as refused:
            if refused.code is not grpc.StatusCode.UNAVAILABLE:
                log.warning("refused %s from node %s: %s", name, node, refused.message)
            await context.abort(refused.code, refused.message)
        except grpc.aio.AioRpcError as error:  # Temporal's own answer (NotFound for a finished task, ...): as it is
            await context.abort(error.code(), error.details() or "", error.trailing_metadata() or ())
        raise AssertionError("unreachable: abort raises")

    async def _principal(self, metadata: Sequence[tuple[str, Any]]) -> Principal:
        """The node token that authorises this call; refused without a live node token."""
        token = next((str(v) for k, v in metadata if k == "authorization"), "")
        token = token.removeprefix("Bearer ").strip()
        if not token:
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, "send this node's token (`authorization: Bearer ...`)")
        try:
            principal = await self.tokens.principal(self.sessions, token)
        except (OSError, OperationalError, DBAPIError) as error:
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

    def _check_namespace(self, name: str, request: bytes | Message) -> None:
        if name == "GetSystemInfo":
            return
        message = request if isinstance(request, Message) else self._parse(name, request)
        namespace = getattr(message, "namespace", None)
        if namespace != self.policy.namespace:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"namespace {namespace!r} is not served to node agents")

    async def _poll(
        self,
        token_id: int,
        node: str,
        method: str,
        request: Message,
        metadata: Sequence[tuple[str, Any]],
        context: grpc.aio.ServicerContext[bytes, bytes],
    ) -> bytes:
        queue = request.task_queue.name  # type: ignore[attr-defined]
        own = node_queue(self.policy.queue_prefix, node)
        if queue != own:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"node {node} may poll only its own task queue {own!r}")
        # A long poll outlives many sweeps: when its token is revoked meanwhile, the sweep cuts it (`_cut_polls`),
        # and the agent is told to poll again (UNAVAILABLE, which the SDK retries with the token it holds now: a
        # rotated agent carries on, a revoked one is refused).
        poll = asyncio.current_task()
        assert poll is not None
        self._polls.setdefault(token_id, set()).add(poll)
        try:
            answered = await self._forward(method, request.SerializeToString(), metadata, context)
        except asyncio.CancelledError:
            if poll not in self._cut:
                raise  # the agent went away
            self._cut.discard(poll)
            poll.uncancel()
            raise Refused(grpc.StatusCode.UNAVAILABLE, "the node token was revoked: poll again") from None
        finally:
            open_polls = self._polls.get(token_id)
            if open_polls is not None:
                open_polls.discard(poll)
                if not open_polls:
                    del self._polls[token_id]
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

    async def _forward(
        self,
        method: str,
        request: bytes,
        metadata: Sequence[tuple[str, Any]],
        context: grpc.aio.ServicerContext[bytes, bytes],
    ) -> bytes:
        passed = tuple((k, v) for k, v in metadata if k in FORWARDED_METADATA)
        call = self.upstream.unary_unary(method)
        return await call(request, metadata=passed, timeout=context.time_remaining())  # type: ignore[no-any-return]
