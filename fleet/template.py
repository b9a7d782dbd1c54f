"""Expand a pool's node template into concrete hosts.

Generated hosts are deterministic: the same template always yields the same names, PCI addresses, MACs and IPs, so
applying a fleet file twice changes nothing.
"""

from __future__ import annotations

from ipaddress import IPv4Address

from fleet.node import FabricClaimMode, Node, NodeTemplate, Slot

# One PCI bus per slot for the GPU and its fabric device, in the style of an 8-GPU HGX board.
_GPU_BUSES = ("1b", "3c", "4b", "5c", "9a", "bb", "cd", "dc")
_FABRIC_BUSES = ("1a", "3a", "4d", "5d", "9b", "ba", "ca", "db")
# Host-wide parent fabric device used when the template describes a node without per-slot VFs.
_SHARED_PARENT = "0000:e1:00.0"


def _bus(table: tuple[str, ...], slot: int) -> str:
    if slot < len(table):
        return table[slot]
    return f"{0x20 + slot:02x}"


def generated_node_names(template: NodeTemplate) -> list[str]:
    width = max(2, len(str(template.first_index + template.count - 1)))
    return [
        f"{template.name_prefix}{i:0{width}d}"
        for i in range(template.first_index, template.first_index + template.count)
    ]


def expand_template(template: NodeTemplate, pool_ordinal: int = 0) -> list[Node]:
    """The hosts a template stands for. `pool_ordinal` keeps MACs and IPs of different pools apart."""
    nodes: list[Node] = []
    per_numa = max(1, template.gpus_per_node // template.numa_nodes)
    for offset, name in enumerate(generated_node_names(template)):
        host = template.first_index + offset
        slots = []
        for index in range(template.gpus_per_node):
            per_slot_vf = template.fabric_claim_mode is FabricClaimMode.PER_SLOT_VF
            fabric_bus = _bus(_FABRIC_BUSES, index)
            slots.append(
                Slot(
                    index=index,
                    gpu_pci=f"0000:{_bus(_GPU_BUSES, index)}:00.0",
                    fabric_parent_pci=f"0000:{fabric_bus}:00.0" if per_slot_vf else _SHARED_PARENT,
                    fabric_vf_pci=f"0000:{fabric_bus}:00.2" if per_slot_vf else None,
                    fabric_claim_mode=template.fabric_claim_mode,
                    nvme_device=f"/dev/disk/by-id/nvme-berth-{name}-slot{index}",
                    numa_node=min(index // per_numa, template.numa_nodes - 1),
                    vcpus=template.vcpus_per_slot,
                    memory_mib=template.memory_mib_per_slot,
                    mac=f"52:54:{pool_ordinal % 256:02x}:{(host >> 8) % 256:02x}:{host % 256:02x}:{index:02x}",
                    private_ip=IPv4Address(int(template.ip_base) + (host * 16 + index) % (1 << 24)),
                )
            )
        nodes.append(
            Node(
                name=name,
                labels=dict(template.labels),
                status=template.status,
                cpus=template.vcpus_per_slot * template.gpus_per_node + 8,
                memory_mib=template.memory_mib_per_slot * template.gpus_per_node + 65536,
                numa_nodes=template.numa_nodes,
                slots=slots,
                simulation=template.simulation,
            )
        )
    return nodes
