"""atom-engine: the serving engine that AtomDeployment pods run."""

__version__ = "0.1.0"
