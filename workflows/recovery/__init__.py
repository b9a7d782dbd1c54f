"""Slot recovery: a teardown that could not reach its node, finished when the node's agent returns."""
