"""The one exception type for mistakes a user must fix (paths, options, files).

`train.py` turns it into a one-line message and exit code 2, without a traceback; anything else
that goes wrong is a bug and keeps its traceback.
"""


class UserError(ValueError):
    """Its message is one line: what is wrong, the value seen, and the fix."""
