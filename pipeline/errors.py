"""The one error type the command line turns into a one-line message and exit code 2."""

from __future__ import annotations


class PipelineError(Exception):
    """A problem with the input (archive, window, definitions) the user can fix.

    ``str(exc)`` is the whole message: one line, naming the file and the key or position.
    """
