"""The node agent's picture of its own host, and how an operator's approved slots are checked against it.

Pure: the models describe what discovery found (`agent/host/` reads it from sysfs and NVML); the checks
are functions of those models and the fleet's slots, with no I/O.
"""
