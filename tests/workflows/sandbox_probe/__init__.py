"""Workflows that reach what a workflow must not, for tests/workflows/test_sandbox.py."""
