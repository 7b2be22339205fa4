"""Errors the runtime raises for bad models and bad requests; messages name the file or field."""


class ModelError(RuntimeError):
    """A model file is missing, unreadable, unsupported, or does not fit the requested layer range."""


class RuntimeUsageError(ValueError):
    """A request to the runtime is inconsistent (unknown session, position past the context, ...)."""
