"""The allocation workflow: one run from request to release (workflow.py), its parts and its client."""
