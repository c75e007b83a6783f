"""Runtime errors that end a command with a clear one-line message (exit code 2)."""


class UsageError(Exception):
    """Bad input from the user: a missing file, an unparsable case, a bad URL."""


class BadBrokerUrl(UsageError, ValueError):
    """`--broker` is not kafka://host:port[,host:port]."""
