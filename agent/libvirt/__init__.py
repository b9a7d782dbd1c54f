"""The libvirt VM runtime of a node agent: domain XML, the cloud-init seed, the driver."""
