"""Configuration errors: one exception type whose message is a single line.

Every bad configuration value surfaces as a :class:`ConfigError` naming where
the value came from: ``<file>: field '<dotted.path>' <reason>`` for JSON
files, ``--flag <reason>`` for command-line flags.  :class:`FieldError` is the
internal form raised while a dataclass validates itself; the loaders prefix it
with the file name (and the path of enclosing objects) before it escapes.
"""

from __future__ import annotations

__all__ = ["ConfigError", "FieldError"]


class ConfigError(ValueError):
    """A configuration value is missing, malformed or out of range."""

    def __init__(self, message: str) -> None:
        # Keep the message on one line so it reads well in a startup log.
        super().__init__(" ".join(message.split("\n")))

    @property
    def message(self) -> str:
        return str(self.args[0])


class FieldError(ConfigError):
    """A field-level problem, before the source (file or flag) is known.

    ``field`` is the dotted path relative to the object being built (for
    example ``stages[1].layer_end``) and ``reason`` completes the sentence
    ``field '<field>' <reason>``.
    """

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"field '{field}' {reason}")

    def prefixed(self, parent: str) -> FieldError:
        """The same error, seen from the object that contains this one."""
        if not parent:
            return self
        return FieldError(f"{parent}.{self.field}", self.reason)

    def in_source(self, source: str) -> ConfigError:
        """The user-facing error: ``<source>: field '<field>' <reason>``."""
        return ConfigError(f"{source}: {self}")

    def as_flag(self, flag: str) -> ConfigError:
        """The user-facing error for a value that came from ``flag``."""
        return ConfigError(f"{flag} {self.reason}")
