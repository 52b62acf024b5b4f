"""The one error type discovery raises.

Parsers raise :class:`DiscoveryError` for input they cannot read (a truncated
or garbled capture) and nothing else: a caller catches this type, states the
problem in the report, and carries on with the other sources.
"""


class DiscoveryError(Exception):
    """Input that could not be read, with a sentence saying what was wrong."""
