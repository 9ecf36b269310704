"""
nanoGPT-style configuration: a script's plain variables are the defaults, then

    python train.py config/some_file.py --key=value --other_key=value

A config file is Python that assigns some of those variables; a --key=value override
is parsed as a Python literal when it is one (3, 1e-3, True, 'x') and is kept as a
string otherwise. Unknown keys and values of the wrong type are refused with a one-line
message (an int where a float is expected is fine). A value may contain '='.
"""

import ast
import difflib
from pathlib import Path

from errors import UserError


def _coerce(key, value, default):
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
    elif isinstance(default, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(default, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif isinstance(default, str):
        return value if isinstance(value, str) else str(value)
    elif default is None or isinstance(value, type(default)):
        return value
    raise UserError(f"{key} expects {type(default).__name__} (default {default!r}), got {value!r}")


def _unknown(key, known):
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ''
    return UserError(f"unknown config key {key!r}{hint}")


def load(defaults, argv):
    """Apply config files and --key=value overrides (in order) to a dict of defaults."""
    cfg = dict(defaults)
    for arg in argv:
        if not arg.startswith('--'):
            path = Path(arg)
            if not path.is_file():
                raise UserError(f"config file {arg!r} not found (arguments are config files or --key=value)")
            scope = {}
            try:
                exec(compile(path.read_text(), str(path), 'exec'), scope)
            except Exception as e:
                raise UserError(f"config file {arg} failed: {type(e).__name__}: {e}")
            for key, value in scope.items():
                if key.startswith('_') or callable(value) or type(value).__name__ == 'module':
                    continue  # helpers a config file may import or define
                if key not in cfg:
                    raise _unknown(key, cfg)
                cfg[key] = _coerce(key, value, defaults[key])
        else:
            key, eq, raw = arg[2:].partition('=')
            if not eq:
                raise UserError(f"override {arg!r} needs a value: --{key}=VALUE")
            if key not in cfg:
                raise _unknown(key, cfg)
            if isinstance(defaults[key], str):
                value = raw  # strings are taken as typed, quotes optional
                if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in '\'"':
                    value = raw[1:-1]
            else:
                try:
                    value = ast.literal_eval(raw)
                except (ValueError, SyntaxError):
                    value = raw
            cfg[key] = _coerce(key, value, defaults[key])
    return cfg
