"""The ModelDeployment workflow (workflow.py) and its replicas' child workflows (replica.py)."""
