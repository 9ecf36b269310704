"""
nanoGPT-style configuration: a script's plain variables are the defaults, then

    python train.py config/some_file.py --key=value --other_key=value

A config file is Python that assigns some of those variables (it may build on another
with `from config.cpu_sa import *`); a --key=value override is parsed as a Python literal
when it is one (3, 1e-3, True, 'x') and is kept as a string otherwise. Unknown keys and
values of the wrong type are refused with a one-line message (an int where a float is
expected is fine). A value may contain '='. What each file and override sets is echoed,
as nanoGPT does ("Overriding config with ...", "Overriding: key = value"), and `-h` /
`--help` lists every key with its default and the comment beside it in the script.
"""

import ast
import difflib
import importlib.util
import io
import os
import sys
import tokenize
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


# -----------------------------------------------------------------------------
# where a config file's values come from (its own lines or a file it imports with *)

def _tree(path):
    try:
        return ast.parse(Path(path).read_text(), str(path))
    except (OSError, SyntaxError, ValueError):
        return None


def _own_names(path):
    tree = _tree(path)
    names = set()
    for node in tree.body if tree else []:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def _imported_files(path):
    tree = _tree(path)
    files = []
    for node in tree.body if tree else []:
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            try:
                spec = importlib.util.find_spec(node.module)
            except (ImportError, ValueError):
                spec = None
            if spec and spec.origin and spec.origin.endswith('.py'):
                files.append(spec.origin)
    return files


def _origin(key, path, seen=()):
    """The file that assigns key: path itself, or a file it imports (recursively)."""
    if key in _own_names(path):
        return path
    for f in _imported_files(path):
        if f not in seen:
            found = _origin(key, f, (*seen, path))
            if found:
                return found
    return None


def _show(path):
    rel = os.path.relpath(path)
    return rel if not rel.startswith('..') else str(path)


# -----------------------------------------------------------------------------

def parse(defaults, argv, script=None):
    """Apply config files and --key=value overrides (in order) to a dict of defaults.

    Returns (config, applied): applied lists (key, value, argument, origin) for every value a
    file or an override set, origin being the file that assigned it (None for an override).
    With -h or --help in argv, prints the help of `script` and exits."""
    if '-h' in argv or '--help' in argv:
        print(help_text(defaults, script))
        sys.exit(0)
    cfg, applied = dict(defaults), []
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
                applied.append((key, cfg[key], arg, _show(_origin(key, path) or path)))
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
            applied.append((key, cfg[key], arg, None))
    return cfg, applied


def load(defaults, argv, script=None, echo=True):
    """parse(), echo what was applied, return the config dict."""
    cfg, applied = parse(defaults, argv, script)
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


# -----------------------------------------------------------------------------
# --help, read from the script itself: its docstring, and the comment beside each variable

def describe(script):
    """{key: (section, comment)} for the script's top-level assignments, from its source."""
    source = Path(script).read_text()
    comments = {}  # line number -> comment text
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = (tok.string.lstrip('#').strip(), tok.line.strip().startswith('#'))
    lines, section, out = source.splitlines(), '', {}
    for node in ast.parse(source).body:
        for ln in range(getattr(node, 'lineno', 0) - 1, 0, -1):  # the section: full-line comments above
            text, full = comments.get(ln, ('', False))
            if not full or not lines[ln - 1].strip():
                break
            if text and set(text) != {'-'}:
                section = text
                break
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            text, full = comments.get(node.end_lineno, ('', True))
            out[node.targets[0].id] = (section, '' if full else text)
    return out


def help_text(defaults, script):
    doc = ast.get_docstring(ast.parse(Path(script).read_text())) if script else None
    name = Path(script).name if script else 'script'
    out = [f"usage: python {name} [config/file.py ...] [--key=value ...]", '']
    if doc:
        out += [doc.strip(), '']
    out.append("Config files are Python assigning these variables; --key=value overrides follow, in order.")
    info = describe(script) if script else {}
    width = max(len(f"{k} = {v!r}") for k, v in defaults.items()) + 2
    section = None
    for key, value in defaults.items():
        sec, comment = info.get(key, ('', ''))
        if sec != section or section is None:
            out += ['', f"{sec}:"] if sec else ['']
            section = sec
        out.append(f"  {f'{key} = {value!r}':<{width}}{comment}".rstrip())
    return '\n'.join(out)
