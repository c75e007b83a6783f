"""Domain errors raised by the engine (invalid objects, cases, config)."""


class EngineError(Exception):
    """Base class for every error the engine raises on bad input."""


class InvalidObject(EngineError):
    """A Kubernetes object is malformed (missing name, wrong types, bad quantity)."""


class InvalidQuantity(InvalidObject):
    """A resource quantity string is not a Kubernetes quantity."""


class InvalidConfig(EngineError):
    """An engine config key has an unknown name or an invalid value."""


class InvalidCase(EngineError):
    """A conformance case file does not follow docs/case-format.md."""
