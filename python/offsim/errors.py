"""offsim's exceptions: one class per kind of failure, all subclasses of offsim.Error.

Each carries the message the CLI prints and, parsed from it, where the problem is:

    try:
        offsim.run("bad.yaml")
    except offsim.InputError as e:
        print(e.file, e.line, e.column, e.key)   # bad.yaml 4 15 training.micro_batch
"""

import re

# "file.yaml:12:5: training.micro_batch: expected ..." (the key path is optional)
_POSITION = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<column>\d+): (?:(?P<key>[\w.\-]+): )?")
# "--set training.micro_batch=two: training.micro_batch: ..." (a value given as an override)
_OVERRIDE = re.compile(r"^(?P<origin>--set [^:]*): (?P<key>[\w.\-]+): ")
# "training.micro_batch: ..." without a position
_KEY_ONLY = re.compile(r"^(?P<key>[A-Za-z_][\w.]*): ")


class Error(Exception):
    """Base class of every offsim error. Attributes: message, origin (where the bad value came
    from: "file:line:col" or "--set key=value"), file, line, column, key (the key path)."""

    def __init__(self, message):
        super().__init__(message)
        self.message = message
        self.file = None
        self.line = None
        self.column = None
        self.key = None
        self.origin = None
        m = _POSITION.match(message)
        if m:
            self.origin = f"{m.group('file')}:{m.group('line')}:{m.group('column')}"
            self.file = m.group("file")
            self.line = int(m.group("line"))
            self.column = int(m.group("column"))
            self.key = m.group("key")
        elif _OVERRIDE.match(message):
            m = _OVERRIDE.match(message)
            self.origin = m.group("origin")
            self.key = m.group("key")
        else:
            m = _KEY_ONLY.match(message)
            if m:
                self.key = m.group("key")


class InputError(Error, ValueError):
    """A malformed or impossible scenario or config (the CLI's exit status 2)."""


class NotFoundError(Error, LookupError):
    """A file, model, system or name that does not exist."""


class LimitError(Error):
    """A size, time or memory limit was exceeded."""


class UnsupportedError(Error):
    """A feature that is not built in or not modelled."""


class CancelledError(Error):
    """The work was stopped on request."""


class IoError(Error, OSError):
    """Reading or writing a file failed."""
