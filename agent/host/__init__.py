"""Host topology discovery for the node agent: what the PCI bus, block layer and NUMA topology say, read from sysfs."""
