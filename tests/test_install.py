"""
The repository installs cleanly beside its dependencies.

Python puts the repository root first on sys.path (scripts are run from it, tests add it),
so a top-level module or package of ours with the name of an installed distribution's
module hides that module from every library that imports it. transformers imports Hugging
Face's `kernels` package at start; when our kernel package was called `kernels`, every
GPT-2 path broke. The test below lists our top-level names against those of every
installed distribution and of the standard library, so the next clash fails here, naming
both sides.
"""
import importlib.metadata
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def top_level_names(root):
    """The names `import X` would find in `root`: modules (X.py) and folders holding Python
    (packages, with or without __init__.py, since a folder of .py files imports as a
    namespace package)."""
    names = set()
    for p in pathlib.Path(root).iterdir():
        if p.name.startswith(('.', '_')):
            continue
        if p.is_file() and p.suffix == '.py':
            names.add(p.stem)
        elif p.is_dir() and p.name.isidentifier() and any(p.glob('*.py')):
            names.add(p.name)
    return names


def clashes(root):
    """{our name: [installed distributions, or the standard library, that also provide it]}."""
    provided = {**importlib.metadata.packages_distributions(),
                **{name: ['the standard library'] for name in sys.stdlib_module_names}}
    return {name: sorted(set(provided[name])) for name in sorted(top_level_names(root)) if name in provided}


def describe(found):
    return '; '.join(f"our top-level '{name}' has the name of a module installed by {', '.join(dists)}"
                     for name, dists in found.items())


def test_no_top_level_name_of_ours_shadows_an_installed_package():
    found = clashes(ROOT)
    assert not found, describe(found) + ': rename ours (imports of the installed package would find ours first)'


def test_clash_check_finds_installed_and_standard_library_names(tmp_path):
    # the check itself can fail: a folder named like an installed module (numpy here, which
    # every environment of ours has) and a file named like a standard-library module are
    # reported with what they hide; a name of ours alone is not
    (tmp_path / 'numpy').mkdir()
    (tmp_path / 'numpy' / '__init__.py').write_text('')
    (tmp_path / 'random.py').write_text('')
    (tmp_path / 'model.py').write_text('')
    found = clashes(tmp_path)
    assert list(found) == ['numpy', 'random'] and 'numpy' in found['numpy']
    assert found['random'] == ['the standard library']
    assert "our top-level 'numpy'" in describe(found)
