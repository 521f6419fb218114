"""KREX's exceptions, in a module of its own: the markers import it without pulling in the cffi
binding, so `krex.region()` works in any Python with the standard library.

Every error KREX raises on purpose derives from `KrexError`; the module that raises one defines
its subclass (ConfigError in config, SegmentError in shm, ...), these are the ones shared.
"""


class KrexError(Exception):
    """Base of every error KREX raises on purpose; its message is for the user."""


class ProtocolError(KrexError):
    """A message that breaks the socket protocol (docs/protocol.md), or a request the daemon
    cannot serve; its message goes back to the other side."""
