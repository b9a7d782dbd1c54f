"""Fixture GPU hosts as sysfs trees, for discovery tests, benchmarks and dry runs."""
