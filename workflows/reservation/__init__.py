"""The reservation workflow: GPUs promised for a window, then its allocation."""
