"""Task queue names (docs/design.md section 6): one for the control plane, one per GPU host.

They travel inside each workflow's input so that one Temporal namespace can host several independent Berth
deployments (or test runs) side by side.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

CONTROL_QUEUE = "berth.control"
NODE_QUEUE_PREFIX = "berth.node."


class Queues(BaseModel):
    model_config = ConfigDict(frozen=True)

    control: str = CONTROL_QUEUE
    node_prefix: str = NODE_QUEUE_PREFIX

    def node(self, node: str) -> str:
        return f"{self.node_prefix}{node}"
