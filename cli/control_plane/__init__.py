"""The `berth` commands that start or set up the control plane's own parts, apart from the client commands beside
this package: `up` and `demo` (the local stack), `worker` (the control worker and the node agents), `gateway` (the
node gateway), `migrate` (the database schema) and `tokens gateway-key` (the node gateway's sealing key).

They need the `server` extra (`pip install 'berth[server]'`): in an install of the client alone `berth --help` still
lists them, and running one says what to install (cli/main.py). The client commands never import this package.
"""
