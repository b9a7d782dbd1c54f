"""Admission: who among the requests waiting in a region's queue is placed next, whom preemption displaces, and the
GPUs reservations hold for a future window."""
