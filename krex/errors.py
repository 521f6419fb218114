"""The root of KREX's exceptions, in a module of its own: the markers import it without
pulling in the cffi binding, so `krex.region()` works in any Python with the standard library."""


class KrexError(Exception):
    """Base of every error KREX raises on purpose."""
