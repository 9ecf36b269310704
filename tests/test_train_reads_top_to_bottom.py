"""
train.py reads top to bottom, as nanoGPT's does: a function in it uses only module-level names
assigned above its definition, so a reader meets every name a function needs before the
function. And it stays short enough to read at one sitting (MAX_LINES): what a concern adds
goes to the module that owns it (checkpoint, data, settings, hardware, run_folder). Checked on the source, without running it: each function's (and lambda's) global
names, found by the symbol table, against the line where the module first binds each name.
The configuration keys become globals through `globals().update(config)`, at that line.
"""
import ast
import builtins
import symtable
from pathlib import Path

from nanohfa import settings

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 560
COMPREHENSIONS = {'listcomp', 'dictcomp', 'setcomp', 'genexpr'}  # run where they stand, not later


def first_bindings(tree, injected):
    """{name: the first line at which the module binds it}: assignments, imports, def and class
    statements at module level (inside if/try/for/with too, not inside functions); `injected`
    names are bound by a `globals().update(...)` statement."""
    first = {}

    def bind(name, line):
        first.setdefault(name, line)

    def visit(node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bind(node.name, node.lineno)
            for d in node.decorator_list:
                visit(d)
            return
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            return  # their names are their own
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bind(node.id, node.lineno)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                bind(a.asname or a.name.split('.')[0], node.lineno)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bind(node.name, node.lineno)
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == 'globals().update':
            for name in injected:
                bind(name, node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child)

    for stmt in tree.body:
        visit(stmt)
    return first


def global_uses(table):
    """The global names a function's body (and anything nested in it) reads or assigns."""
    names = {s.get_name() for s in table.get_symbols()
             if s.is_global() and (s.is_referenced() or s.is_assigned())}
    for child in table.get_children():
        names |= global_uses(child)
    return names


def names_used_before_binding(source, injected=()):
    """[(function, its line, name, the line the module first binds it or None)] for every
    module-level function or lambda that uses a module-level name bound only below it (or
    nowhere, and not a builtin)."""
    first = first_bindings(ast.parse(source), set(injected))
    found = []
    for table in symtable.symtable(source, 'train.py', 'exec').get_children():
        if table.get_type() != 'function' or table.get_name() in COMPREHENSIONS:
            continue
        for name in sorted(global_uses(table)):
            line = first.get(name)
            if line is None and hasattr(builtins, name):
                continue
            if line is None or line > table.get_lineno():
                found.append((table.get_name(), table.get_lineno(), name, line))
    return found


def test_train_py_functions_use_only_names_bound_above_them():
    source = (ROOT / 'train.py').read_text()
    late = names_used_before_binding(source, settings.defaults(settings.TRAIN))
    assert not late, '; '.join(f"{fn} (line {at}) uses {name}, bound {f'at line {line}' if line else 'nowhere'}"
                               for fn, at, name, line in late)


def test_train_py_is_at_most_max_lines_long():
    lines = len((ROOT / 'train.py').read_text().splitlines())
    assert lines <= MAX_LINES, (f"train.py is {lines} lines, over {MAX_LINES}: move what grew to the module that "
                                f"owns it (checkpoint.py, data.py, settings.py, hardware.py, run_folder.py)")


def test_the_check_finds_a_name_bound_below_and_one_bound_nowhere():
    # the check itself can fail: a function reading a global assigned after it, a lambda
    # reading an injected key that is bound later, and a name bound nowhere are all reported
    source = '\n'.join([
        "import math",
        "early = 1",
        "def f(x):",
        "    return x + early + late + math.pi + len([late for _ in range(2)])",
        "g = lambda: key",
        "late = 2",
        "globals().update(config)",
        "def h():",
        "    global counter",
        "    counter = nowhere",
        "    return key + late",
    ])
    late = names_used_before_binding(source, ['key'])
    assert late == [('f', 3, 'late', 6), ('lambda', 5, 'key', 7), ('h', 8, 'counter', None),
                    ('h', 8, 'nowhere', None)]
