"""Quota as Kueue keeps it: accounts that borrow and lend within cohort trees, fair sharing, decayed usage."""
