"""marlhf: MA-RLHF (RLHF with macro actions) as a command-line toolkit."""

__version__ = "0.1.0"
