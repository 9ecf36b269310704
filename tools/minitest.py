"""
Run pytest-style test files where pytest is not installed (e.g. a bare GPU image):

    python3 tools/minitest.py tests/test_kernels_triton.py tests/test_kernels_compile.py --json out.json

Provides the little of pytest those files use (mark.parametrize / skipif, fixtures with
tmp_path and monkeypatch, raises, skip, approx), loads tests/conftest.py first, runs every
test, prints one line each and a 'N passed, N failed, N skipped' summary, writes the results
as JSON, and exits non-zero if any failed. With pytest available, use pytest.
"""

import argparse
import contextlib
import importlib.util
import inspect
import itertools
import json
import math
import os
import re
import sys
import tempfile
import time
import traceback
import types


class Skipped(Exception):
    pass


class Mark:
    def __init__(self, name, args, kwargs):
        self.name, self.args, self.kwargs = name, args, kwargs

    def __call__(self, fn):
        fn.__dict__.setdefault('_marks', []).append(self)
        return fn


class MarkFactory:
    def __getattr__(self, name):
        return lambda *a, **k: Mark(name, a, k)


def fixture(fn=None, autouse=False, scope='function'):
    def wrap(f):
        f._fixture = dict(autouse=autouse, scope=scope)
        return f
    return wrap(fn) if fn is not None else wrap


def skip(reason=''):
    raise Skipped(reason)


@contextlib.contextmanager
def raises(exc, match=None):
    class Info:
        value = None
    info = Info()
    try:
        yield info
    except exc as e:
        info.value = e
        if match and not re.search(match, str(e)):
            raise AssertionError(f'{e!r} does not match {match!r}')
        return
    raise AssertionError(f'did not raise {exc}')


class approx:
    def __init__(self, expected, rel=1e-6, abs=1e-12):
        self.expected, self.rel, self.abs = expected, rel, abs

    def __eq__(self, other):
        return math.isclose(other, self.expected, rel_tol=self.rel, abs_tol=self.abs)


class MonkeyPatch:
    def __init__(self):
        self.undo = []

    def setenv(self, name, value):
        self.undo.append((name, os.environ.get(name)))
        os.environ[name] = str(value)

    def delenv(self, name, raising=True):
        self.undo.append((name, os.environ.get(name)))
        os.environ.pop(name, None)

    def restore(self):
        for name, old in reversed(self.undo):
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def importorskip(name):
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise Skipped(f'{name} not importable: {e}')


def install_fake_pytest():
    m = types.ModuleType('pytest')
    m.mark, m.fixture, m.skip, m.raises, m.approx = MarkFactory(), fixture, skip, raises, approx
    m.importorskip = importorskip
    sys.modules['pytest'] = m


class Fixtures:
    """Resolves fixtures by parameter name: tmp_path, monkeypatch and the module's own
    (scope 'module' kept until the module's tests end, else one per test; generators are
    run to their yield and finished afterwards)."""

    def __init__(self, module_fixtures):
        self.defs, self.module_cache, self.module_gens = module_fixtures, {}, []

    def call(self, name, test_gens):
        f = self.defs[name]
        if f._fixture['scope'] == 'module' and name in self.module_cache:
            return self.module_cache[name]
        r = f()
        if inspect.isgenerator(r):
            gen, r = r, next(r)
            (self.module_gens if f._fixture['scope'] == 'module' else test_gens).append(gen)
        if f._fixture['scope'] == 'module':
            self.module_cache[name] = r
        return r

    def close(self):
        for g in reversed(self.module_gens):
            with contextlib.suppress(StopIteration):
                next(g)


def expand(fn):
    """[(id, kwargs)] from stacked parametrize marks (the cartesian product)."""
    axes = []
    for mark in reversed(fn.__dict__.get('_marks', [])):
        if mark.name != 'parametrize':
            continue
        names = [n.strip() for n in mark.args[0].split(',')]
        rows = []
        for i, v in enumerate(mark.args[1]):
            vals = v if len(names) > 1 else (v,)
            rows.append((str(i), dict(zip(names, vals))))
        axes.append(rows)
    for combo in itertools.product(*axes):
        kw = {}
        for _, d in combo:
            kw.update(d)
        yield '-'.join(i for i, _ in combo), kw


def skip_reason(fn, module):
    marks = list(fn.__dict__.get('_marks', []))
    module_marks = getattr(module, 'pytestmark', [])
    marks += module_marks if isinstance(module_marks, list) else [module_marks]
    for mark in marks:
        if mark.name == 'skipif' and mark.args and mark.args[0]:
            return mark.kwargs.get('reason', 'skipif')
    return None


def run_module(path, results):
    name = os.path.splitext(os.path.basename(path))[0]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))  # child processes import it by name
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except Skipped as e:
        results.append(dict(test=os.path.basename(path), status='skipped', seconds=0, detail=str(e)))
        print(f"SKIPPED  {os.path.basename(path)} ({e})", flush=True)
        return
    defs = {n: f for n, f in vars(mod).items() if callable(f) and hasattr(f, '_fixture')}
    fixtures = Fixtures(defs)
    try:
        run_tests(path, mod, defs, fixtures, results)
    finally:
        fixtures.close()


def run_tests(path, mod, defs, fixtures, results):
    for name, fn in list(vars(mod).items()):
        if not name.startswith('test_') or not callable(fn):
            continue
        for pid, kw in expand(fn):
            test_id = f"{os.path.basename(path)}::{name}[{pid}]" if pid else f"{os.path.basename(path)}::{name}"
            reason = skip_reason(fn, mod)
            t0 = time.time()
            status, detail = 'passed', ''
            gens, mp, tmp = [], MonkeyPatch(), None
            try:
                if reason:
                    raise Skipped(reason)
                for fname, f in defs.items():
                    if f._fixture['autouse']:
                        fixtures.call(fname, gens)
                params = inspect.signature(fn).parameters
                for pname in params:
                    if pname in defs and pname not in kw:
                        kw[pname] = fixtures.call(pname, gens)
                if 'tmp_path' in params:
                    tmp = tempfile.TemporaryDirectory()
                    from pathlib import Path
                    kw['tmp_path'] = Path(tmp.name)
                if 'monkeypatch' in params:
                    kw['monkeypatch'] = mp
                fn(**kw)
            except Skipped as e:
                status, detail = 'skipped', str(e)
            except Exception:
                status, detail = 'failed', traceback.format_exc(limit=6)
            finally:
                for g in gens:
                    with contextlib.suppress(StopIteration):
                        next(g)
                mp.restore()
                if tmp is not None:
                    tmp.cleanup()
            dt = time.time() - t0
            results.append(dict(test=test_id, status=status, seconds=round(dt, 3), detail=detail[-3000:]))
            print(f"{status.upper():<8} {dt:6.1f}s {test_id}" + (f"  ({detail.strip().splitlines()[-1]})"
                                                                  if status != 'passed' and detail else ''), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('files', nargs='+')
    p.add_argument('--json', default=None)
    args = p.parse_args()
    install_fake_pytest()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, root)
    conftest = os.path.join(root, 'tests', 'conftest.py')
    if os.path.exists(conftest):
        exec(compile(open(conftest).read(), conftest, 'exec'), {'__name__': 'conftest', '__file__': conftest})
    results = []
    for f in args.files:
        try:
            run_module(f, results)
        except Exception:
            results.append(dict(test=f, status='failed', seconds=0, detail=traceback.format_exc(limit=6)))
            print(f"FAILED   {f}: could not load\n{results[-1]['detail']}", flush=True)
    counts = {s: sum(r['status'] == s for r in results) for s in ('passed', 'failed', 'skipped')}
    print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    if args.json:
        with open(args.json, 'w') as fh:
            json.dump(dict(counts=counts, results=results), fh, indent=1)
    sys.exit(1 if counts['failed'] else 0)


if __name__ == '__main__':
    main()
