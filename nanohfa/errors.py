"""One kind of error for bad input: printed as one line on stderr, non-zero exit, no traceback.

Every script imports this module; its exception hook turns an uncaught UserError into
`error: <message>` and exit status 2. Any other exception keeps its full traceback,
because that is a bug, not a user mistake. Under torchrun the message also goes into the
worker's torchelastic error file, so torchrun's failure report names it as the root cause
instead of "To enable traceback see ...".
"""

import argparse
import json
import os
import sys
import time


class UserError(Exception):
    """Bad input. The message says what is wrong and how to fix it."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with a mistake on the command line as one line (`error: ...`), not usage + error."""

    def error(self, message):
        raise UserError(f"{message} (see {self.prog} --help)")


def folder_name(name, what):
    """name, if it names one folder inside its parent: not empty, '.' or '..', no path separator
    or NUL, no surrounding spaces. A name that escaped (../x, /abs) would write outside the folder
    the user gave, and one with a trailing separator (sa/) would share another name's folder."""
    bad = not isinstance(name, str) or name != name.strip() or name in ('', '.', '..') or \
        any(c in name for c in ('/', '\\', '\0'))
    if bad:
        raise UserError(f"{what} {name!r} is not a folder name: give one path component (letters, digits, "
                        f"'_', '-', '.'; no '/', no '..')")
    return name


def _hook(kind, value, tb, _default=sys.excepthook):
    if issubclass(kind, UserError):
        # the real stderr: torch.distributed wraps this hook and buffers sys.stderr; under
        # torchrun every process meets the same bad input, so rank 0 alone says it
        if os.environ.get('RANK', '0') == '0':
            print(f"error: {value}", file=sys.__stderr__, flush=True)
        error_file = os.environ.get('TORCHELASTIC_ERROR_FILE')
        if error_file:  # torchelastic's format; the report shows py_callstack: our one line
            line = f"error: {value}"
            try:
                with open(error_file, 'w') as f:
                    json.dump({'message': {'message': line, 'extraInfo': {
                        'py_callstack': line, 'timestamp': str(int(time.time()))}}}, f)
            except OSError:
                pass
        sys.exit(2)  # inside the hook, so the interpreter exits with 2 instead of 1
    if issubclass(kind, KeyboardInterrupt):
        print("interrupted", file=sys.stderr)
        return
    _default(kind, value, tb)


sys.excepthook = _hook
