"""Worker entry point."""
