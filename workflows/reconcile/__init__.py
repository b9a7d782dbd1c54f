"""The reconciler: PostgreSQL, Temporal and the hosts compared, and repaired when asked."""
