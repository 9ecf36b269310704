"""
nanoGPT-style configuration: defaults (settings.py), then

    python train.py config/some_file.py --key=value --other_key=value

A config file is Python that assigns some of the keys (it may build on another with
`from config.cpu_sa import *`); a --key=value override is parsed as a Python literal when it
is one (3, 1e-3, True, 'x') and is kept as a string otherwise. Unknown keys and values of the
wrong type are refused with a one-line message (an int where a float is expected is fine). A
value may contain '='. What each file and override sets is echoed, as nanoGPT does
("Overriding config with ...", "Overriding: key = value"), with the file a value was
inherited from; `-h` / `--help` prints the settings table.
"""

import ast
import difflib
import importlib.util
import os
import sys
import textwrap
from pathlib import Path

from nanohfa.errors import UserError


def literal(text):
    """A Python literal if it is one (2, 1e-3, True), else the text itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _coerce(key, value, default):
    if isinstance(default, str):
        return value if isinstance(value, str) else str(value)
    kinds = (int, float) if isinstance(default, float) else type(default)  # an int where a float is expected
    if isinstance(value, kinds) and isinstance(value, bool) == isinstance(default, bool):
        return float(value) if isinstance(default, float) else value
    raise UserError(f"{key} expects {type(default).__name__} (default {default!r}), got {value!r}")


def _unknown(key, known):
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.5)
    return UserError(f"unknown config key {key!r}" + (f"; did you mean {', '.join(close)}?" if close else ''))


def _origin(key, path, seen=()):
    """The file that assigns key: the config file itself, or one it star-imports (recursively)."""
    try:
        body = ast.parse(Path(path).read_text(), str(path)).body
    except (OSError, SyntaxError, ValueError):
        return None
    for node in body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, 'target', None)]
        if any(isinstance(n, ast.Name) and n.id == key for t in targets if t for n in ast.walk(t)):
            return path
    for node in body:
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            try:
                spec = importlib.util.find_spec(node.module)
            except (ImportError, ValueError):
                continue
            if spec and spec.origin and spec.origin.endswith('.py') and spec.origin not in seen:
                found = _origin(key, spec.origin, (*seen, path))
                if found:
                    return found
    return None


def _show(path):
    rel = os.path.relpath(path)
    return str(path) if rel.startswith('..') else rel


def parse(defaults, argv, help_text=''):
    """Apply config files and --key=value overrides (in order) to a dict of defaults.

    Returns (config, applied): applied lists (key, value, argument, origin) for every value a
    file or an override set, origin being the file that assigned it (None for an override).
    With -h or --help in argv, prints help_text and exits."""
    if '-h' in argv or '--help' in argv:
        print(help_text)
        sys.exit(0)
    cfg, applied = dict(defaults), []
    for arg in argv:
        if not arg.startswith('--'):
            path = Path(arg)
            if not path.is_file():
                raise UserError(f"config file {arg!r} not found (arguments are config files or --key=value)")
            if path.suffix != '.py':  # YAML's `n_layer: 4` is valid Python that assigns nothing
                raise UserError(f"config file {arg} is not a Python file (.py); config files are Python assigning "
                                f"keys (n_layer = 4), as nanoGPT's: rewrite it as a .py file, or give --key=value")
            scope = {}
            try:
                tree = ast.parse(path.read_text(), str(path))
                bare = [n for n in tree.body if isinstance(n, ast.AnnAssign) and n.value is None]
                if bare:
                    raise UserError(f"config file {arg} line {bare[0].lineno}: '{ast.unparse(bare[0])}' assigns "
                                    f"nothing (a type annotation); write {ast.unparse(bare[0].target)} = "
                                    f"{ast.unparse(bare[0].annotation)}")
                exec(compile(tree, str(path), 'exec'), scope)
            except UserError:
                raise
            except Exception as e:
                raise UserError(f"config file {arg} failed: {type(e).__name__}: {e}")
            sets = [(k, v) for k, v in scope.items()  # leave out what a file may import or define
                    if not k.startswith('_') and not callable(v) and type(v).__name__ != 'module']
            origin = lambda key: _show(_origin(key, path) or path)
        else:
            key, eq, raw = arg[2:].partition('=')
            if not eq:
                raise UserError(f"override {arg!r} needs a value: --{key}=VALUE")
            if key not in cfg:
                raise _unknown(key, cfg)
            if isinstance(defaults[key], str):  # taken as typed, quotes optional
                value = raw[1:-1] if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in '\'"' else raw
            else:
                value = literal(raw)
            sets, origin = [(key, value)], lambda key: None
        for key, value in sets:
            if key not in cfg:
                raise _unknown(key, cfg)
            cfg[key] = _coerce(key, value, defaults[key])
            applied.append((key, cfg[key], arg, origin(key)))
    return cfg, applied


def load(defaults, argv, help_text='', echo=True):
    """parse(), echo what was applied, return the config dict."""
    cfg, applied = parse(defaults, argv, help_text)
    if echo:
        print_applied(applied)
    return cfg


def print_applied(applied):
    """nanoGPT's echo: the keys each config file sets (inherited ones say from where), then
    each override."""
    last_arg = None
    for key, value, arg, origin in applied:
        if origin is None:
            print(f"Overriding: {key} = {value!r}")
            continue
        if arg != last_arg:
            print(f"Overriding config with {arg}:")
            last_arg = arg
        note = f"  (from {origin})" if os.path.abspath(origin) != os.path.abspath(arg) else ''
        print(f"  {key} = {value!r}{note}")


def help_text(table, script, doc):
    """--help: usage, the script's docstring, then every setting of `table` (settings.py) by
    section, with its default, meaning and range."""
    out = [f"usage: python {script} [config/file.py ...] [--key=value ...]", '', doc.strip(), '',
           "Config files are Python assigning these keys; --key=value overrides follow, in order."]
    width = max(len(f"{k} = {s.default!r}") for section in table.values() for k, s in section.items()) + 2
    for section, settings in table.items():
        out += ['', f"{section}:"] if section else ['']
        for key, s in settings.items():
            valid = f" ({s.valid})" if s.valid else ''
            out += textwrap.wrap(s.help + valid, 110, initial_indent=f"  {f'{key} = {s.default!r}':<{width}}",
                                 subsequent_indent=' ' * (width + 2), break_on_hyphens=False)
    return '\n'.join(out)
