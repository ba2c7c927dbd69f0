"""A CPU stand-in for NVIDIA apex (tests only; see tests/stubs/README.md)."""
