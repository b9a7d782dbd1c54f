"""Placement: one pass from tenant and region through pools and nodes to the bundles on one host."""
