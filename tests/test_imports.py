"""No import circle among the project's own modules: every .py file outside tests/ (the root's modules,
attention_kernels/, experiments/, tools/), with its imports read by ast wherever they stand (at the
top, inside a function, relative or absolute), each resolved to the project module it names. A
circle (A imports B, ..., which imports A) fails with the modules and the lines that close it.

One edge is not an import between modules: a package's file naming its own package (attention_kernels/
sa.py's `import attention_kernels`). Python loads a package's __init__ before any file of it, so every
file of a package depends on its __init__ by construction; the package's __init__ importing its files
and they reading its names is what a package is, not a circle between two modules."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def project_modules(root):
    """{dotted module name: path} of every .py file under root outside tests/ and hidden folders."""
    found = {}
    for path in root.rglob('*.py'):
        parts = path.relative_to(root).with_suffix('').parts
        if parts[0] == 'tests' or any(p.startswith('.') for p in parts):
            continue
        found['.'.join(parts[:-1] if parts[-1] == '__init__' else parts)] = path
    return found


def imports_of(name, path, modules):
    """{module: line} of the project modules that `name` (at `path`) imports, anywhere in the file."""
    package = name.split('.') if path.name == '__init__.py' else name.split('.')[:-1]
    named = {}

    def project(dotted, line):  # the longest project module a dotted name starts with
        parts = dotted.split('.')
        for i in range(len(parts), 0, -1):
            if '.'.join(parts[:i]) in modules:
                named.setdefault('.'.join(parts[:i]), line)
                return

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                project(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = '.'.join(base + (node.module.split('.') if node.module else []))
            for alias in node.names:  # `from pkg import mod` names a module; `from mod import f`, its module
                project(f"{module}.{alias.name}" if module else alias.name, node.lineno)
    own_packages = {'.'.join(name.split('.')[:i]) for i in range(1, name.count('.') + 1)}
    return {m: line for m, line in named.items() if m != name and m not in own_packages}


def import_circles(root):
    """Every circle of imports among root's modules, as [(module, line of its import of the next)]."""
    modules = project_modules(root)
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    circles = []
    for component in components:  # one circle through each: follow imports inside the component back to its start
        path, seen = [component[0]], {component[0]}
        while True:
            nxt = next((w for w in sorted(graph[path[-1]]) if w in component and (w == path[0] or w not in seen)), None)
            if nxt is None or nxt == path[0]:
                break
            path.append(nxt)
            seen.add(nxt)
        circles.append([(m, graph[m].get(path[(i + 1) % len(path)])) for i, m in enumerate(path)])
    return circles


def test_no_import_circle_among_the_project_modules():
    circles = import_circles(ROOT)
    assert circles == [], '; '.join(' -> '.join(f"{m} (line {line})" for m, line in c) + f" -> {c[0][0]}"
                                    for c in circles)


def write(root, files):
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_a_circle_through_an_import_inside_a_function_is_found(tmp_path):
    write(tmp_path, {'a.py': 'import b\n', 'b.py': 'import json\n\ndef f():\n    import c\n',
                     'c.py': 'from a import something\n', 'tests/t.py': 'import a\n'})
    assert import_circles(tmp_path) == [[('a', 1), ('b', 4), ('c', 1)]]


def test_a_circle_through_relative_imports_in_a_package_is_found(tmp_path):
    write(tmp_path, {'pkg/__init__.py': '', 'pkg/x.py': 'from . import y\n', 'pkg/y.py': 'from .x import f\n'})
    assert import_circles(tmp_path) == [[('pkg.x', 1), ('pkg.y', 1)]]


def test_a_package_file_naming_its_own_package_is_not_a_circle(tmp_path):
    write(tmp_path, {'pkg/__init__.py': 'from pkg import x\n', 'pkg/x.py': 'import pkg\n\ndef f():\n    pkg.g()\n',
                     'tests/test_x.py': 'import pkg.x\n'})
    assert import_circles(tmp_path) == []


def test_the_launchers_import_their_shared_module_and_each_imports_alone():
    modules = project_modules(ROOT)
    assert 'nanohfa.grid_runs' in imports_of('compare', ROOT / 'compare.py', modules)
    assert 'nanohfa.grid_runs' in imports_of('nanohfa.slurm', ROOT / 'nanohfa/slurm.py', modules)
    assert 'compare' not in imports_of('nanohfa.slurm', ROOT / 'nanohfa/slurm.py', modules)
    for name in ('nanohfa.slurm', 'compare', 'interactions', 'nanohfa.interactions_seeds'):
        done = subprocess.run([sys.executable, '-c', f'import {name}'], cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


def test_the_code_a_run_records_is_what_train_py_imports(tmp_path):
    """run.json's code record: train.py, what it imports (and what that imports), and attention_kernels/;
    a change to a launcher, a benchmark or a tool is not a change to the code a run trains with."""
    import shutil
    from nanohfa import run_folder
    names = {f.relative_to(ROOT).as_posix() for f in run_folder.code_files(ROOT)}
    assert {'train.py', 'model.py', 'nanohfa/data.py', 'nanohfa/shards.py', 'nanohfa/checkpoint.py',
            'attention_kernels/__init__.py'} <= names
    assert not {'compare.py', 'nanohfa/slurm.py', 'nanohfa/grid_runs.py', 'bench.py', 'sample.py'} & names
    for f in ROOT.glob('*.py'):
        shutil.copy(f, tmp_path / f.name)
    shutil.copytree(ROOT / 'attention_kernels', tmp_path / 'attention_kernels')
    shutil.copytree(ROOT / 'nanohfa', tmp_path / 'nanohfa')
    before = run_folder.code_version(tmp_path)
    assert before['commit'] is None and before['changes'] is None  # not a git checkout: the files' hash alone
    with open(tmp_path / 'nanohfa/slurm.py', 'a') as f:
        f.write('# the launcher changed\n')
    assert run_folder.code_version(tmp_path) == before
    with open(tmp_path / 'model.py', 'a') as f:
        f.write('# the model changed\n')
    assert run_folder.code_version(tmp_path)['files'] != before['files']


def test_a_change_to_any_package_module_train_py_imports_changes_the_code_record(tmp_path):
    """The code record follows train.py's imports into nanohfa/: each package file it reaches,
    changed by one comment line, changes run.json's `files` hash."""
    import shutil
    from nanohfa import run_folder
    for f in ROOT.glob('*.py'):
        shutil.copy(f, tmp_path / f.name)
    for d in ('attention_kernels', 'nanohfa'):
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns('__pycache__'))
    reached = [f for f in run_folder.code_files(tmp_path) if f.parent.name == 'nanohfa']
    assert {'__init__.py', 'data.py', 'checkpoint.py', 'settings.py', 'run_folder.py'} <= {f.name for f in reached}
    before = run_folder.code_version(tmp_path)['files']
    for f in reached:
        text = f.read_text()
        f.write_text(text + '# changed\n')
        assert run_folder.code_version(tmp_path)['files'] != before, f.name
        f.write_text(text)
    assert run_folder.code_version(tmp_path)['files'] == before
