"""relay: the lockstep relay server built on relay_core (see README.md)."""
__version__ = "0.1.0"
