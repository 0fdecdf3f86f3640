"""The SDK's refusals: a call that must not go on, said in one line.

An uncaught :class:`Refused` ends the script with its one line on stderr (no
traceback; sdk/session.py's exception hook) and exit code 1, before anything
more is written: a changed split, a checkpoint published behind the last one,
a recovery call made out of place.
"""

from __future__ import annotations


class Refused(ValueError):
    """A refused SDK call; ``str()`` is one line that names what is wrong and what to do."""
