"""The cluster side of ModelDeployments: the driver interface a Kubernetes cluster is reached through, the workload
a replica renders to, a simulated driver, and the thin activities over them."""
