"""The one exception type for mistakes a user must fix (paths, options, files).

`train.py` turns it into a one-line message and exit code 2, without a traceback; anything else
that goes wrong is a bug and keeps its traceback.
"""

import sys


class UserError(ValueError):
    """Its message is one line: what is wrong, the value seen, and the fix."""


class OutOfMemory(UserError):
    """A run that would run out of GPU memory, found before it does (summary.json: `out of memory`)."""


def print_error(message: str) -> None:
    """`error: MESSAGE` on stderr in one write: under torchrun every rank prints it, and print()'s
    separate newline write let two ranks' lines run together on an unbuffered stderr."""
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
