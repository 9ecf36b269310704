"""
lm-evaluation-harness tasks on our checkpoints (the model itself: lm_eval_model.py): the tasks a
name means, eval.py's evaluation and its results file, and compare.py --eval_tasks, every task on
every finished run of a grid as a table over seeds, with the held-out loss in bits per byte.

A name given is a task, a tag (a name for several tasks: each its own column) or a group: its
own aggregate where lm-eval defines one (`aggregate_metric_list`, as mmlu), else its tasks. In a
grid each name is evaluated on its own, so a task that fails (a character the model lacks, data
not on this machine, a continuation longer than block_size) costs its own column for that run
and one line in the summary, nothing else. Each run's results are kept beside its checkpoint and
reused under a key: lm-eval's version, the resolved config of every task the name stands for,
the model arguments (device and dtype as resolved), limit, few-shot count and the checkpoint's
size and time; a change to any of them evaluates that name again.
"""

import dataclasses
import difflib
import functools
import hashlib
import json
import math
import os
import re
import sys
import time
import traceback
from pathlib import Path

from nanohfa.lm_eval_model import MODEL_ARGS, NanoHFA, note_cuts  # first: it imports lm-eval as the environment needs

import lm_eval  # noqa: E402
from lm_eval.api.group import Group  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402
from lm_eval.utils import handle_non_serializable, simple_parse_args_string  # noqa: E402

from nanohfa import devices  # noqa: E402
from nanohfa import hub  # noqa: E402
from nanohfa import tokenizer as tok  # noqa: E402
from nanohfa.errors import UserError  # noqa: E402

RESULTS = 'lm_eval_results.json'  # beside the checkpoint
PER_TASK = ('results', 'groups', 'group_subtasks', 'configs', 'versions', 'n-shot', 'higher_is_better', 'n-samples')


@functools.lru_cache
def task_manager(include_path='', defaults=True):
    """lm-eval's index of tasks: include_path's YAMLs, and its own (thousands: seconds) if defaults."""
    return TaskManager(include_path=include_path or None, include_defaults=defaults)


def task_list(tasks, include_path=''):
    """(task names, a TaskManager that knows them all); lm-eval's own tasks are indexed only when
    include_path lacks one. A name lm-eval does not know (task, group or tag): a one-line refusal."""
    names = [t.strip() for t in tasks.split(',') if t.strip()] if isinstance(tasks, str) else list(tasks)
    if include_path and names and set(names) <= set(task_manager(str(include_path), False).all_tasks):
        return names, task_manager(str(include_path), False)
    manager = task_manager(str(include_path or ''), True)
    unknown = [t for t in names if t not in manager.all_tasks]
    if not names or unknown:
        near = {t: difflib.get_close_matches(t, manager.all_tasks, n=3) for t in unknown}
        hints = '; '.join(f"{t}: did you mean {', '.join(m)}?" for t, m in near.items() if m)
        raise UserError(f"unknown lm-eval task(s) {', '.join(unknown) or '(none given)'}"
                        + (f" ({hints})" if hints else '')
                        + "; `python -m lm_eval ls tasks` lists them, --include_path DIR adds a folder of task YAMLs")
    return names, manager


def parse_model_args(text):
    """compare.py --eval_model_args 'KEY=VALUE,...': eval.py's model settings, checked, over their defaults."""
    given = simple_parse_args_string(text) if text else {}
    unknown = sorted(set(given) - set(MODEL_ARGS))
    if unknown:
        near = {k: difflib.get_close_matches(k, MODEL_ARGS, n=1) for k in unknown}
        raise UserError(f"--eval_model_args: unknown key(s) {', '.join(unknown)}"
                        + ''.join(f" ({k}: did you mean {m[0]}?)" for k, m in near.items() if m)
                        + f"; valid: {', '.join(MODEL_ARGS)} (eval.py's flags of the same names)")
    args = {**MODEL_ARGS, **{k: str(v) if isinstance(MODEL_ARGS[k], str) else v for k, v in given.items()}}
    for k in ('batch_size', 'max_gen_toks'):
        if not isinstance(args[k], int) or isinstance(args[k], bool) or args[k] < 1:
            raise UserError(f"--eval_model_args: {k}={args[k]!r} must be a whole number >= 1")
    if args['unknown_chars'] not in ('error', 'drop'):
        raise UserError(f"--eval_model_args: unknown_chars={args['unknown_chars']!r}; valid: error, drop")
    devices.pick_dtype(args['dtype'], devices.pick_device(args['device']))  # a device or dtype this machine lacks
    return args


def resolved(model_args):
    """The model arguments as they decide the numbers: device type and dtype as resolved here."""
    device = devices.pick_device(model_args['device'])
    return {**model_args, 'device': device.split(':')[0], 'dtype': devices.pick_dtype(model_args['dtype'], device)[0]}


def failure_line(e):
    """One line for an exception met while evaluating: a UserError's message, a task's data that
    is not on this machine with the fix, anything else as type and first line (its traceback on stderr)."""
    if isinstance(e, UserError):
        return str(e)
    if isinstance(e, (OSError, ConnectionError)):  # a task's data not in the local cache, offline
        return f"a task's data could not be loaded ({hub.first_line(e)})" + (
            "; offline: put its dataset in the local datasets cache (HF_DATASETS_CACHE), or give a folder of "
            "local task YAMLs with --include_path (docs/evaluation.md)" if hub.offline_now() else '')
    traceback.print_exception(e, file=sys.stderr)
    return f"{type(e).__name__}: {hub.first_line(e)}"


def run_tasks(lm, names, manager, limit=None, num_fewshot=None, bar=True):
    """lm-eval's results dict of `names` (on rank 0; None on the other processes of torchrun)."""
    try:
        return lm_eval.simple_evaluate(model=lm, tasks=list(names), num_fewshot=num_fewshot, limit=limit,
                                       task_manager=manager, log_samples=False,
                                       verbosity='WARNING' if bar else 'ERROR')
    except (OSError, ConnectionError) as e:
        raise UserError(failure_line(e)) from None
    except ValueError as e:
        if 'Duplicate task' not in str(e):
            raise
        raise UserError(f"{e}: name a group or its tasks, not both (lm-eval evaluates a task once)") from None


def evaluate(path, tasks, include_path='', limit=None, num_fewshot=None, bar=True, **model_args):
    """eval.py: lm-eval's results dict for the checkpoint at `path` on `tasks` (names or 'a,b,c'),
    the request recorded under 'nanohfa'; None on every process of torchrun but the first."""
    lm = NanoHFA(path=path, **model_args)  # first: a bad checkpoint is told in a second, tasks may take longer
    names, manager = task_list(tasks, include_path)
    results = run_tasks(lm, names, manager, limit, num_fewshot, bar)
    note_cuts(lm)  # the last collective under torchrun
    if lm.world_size > 1:
        import torch.distributed as dist
        dist.destroy_process_group()
    if results is None:
        return None
    results['nanohfa'] = {'checkpoint': lm.path, 'lm_eval': lm_eval.__version__, 'tasks': names,
                          'include_path': str(include_path or ''), 'limit': limit, 'num_fewshot': num_fewshot,
                          'model_args': resolved({**MODEL_ARGS, **model_args}), 'processes': lm.world_size}
    return results


def write_results(results, path):
    """The results JSON, written to a temporary name and renamed: a failure never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f'{path.name}.{os.getpid()}.tmp')
    tmp.write_text(json.dumps(results, indent=1, default=handle_non_serializable))
    os.replace(tmp, path)


def checkpoint_state(ckpt):
    """What identifies the weights results were computed on: a checkpoint file's size and
    mtime, or those of every file of a folder (a Hugging Face export or GPT-2 folder)."""
    ckpt = Path(ckpt)
    files = sorted(f for f in ckpt.iterdir() if f.is_file()) if ckpt.is_dir() else [ckpt]
    return [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files]


def default_results(results, ckpt):
    """eval.py without --output_path: (the file to write, what to write). A run's results go
    beside its ckpt.pt; a folder's (an export, GPT-2) beside the folder, never into it (the
    Hub upload and export_hf --overwrite take the folder whole). A second evaluation of the
    same weights merges into the saved file, task by task (a task given again is replaced);
    saved results of other weights are kept: the new ones go to a dated file beside them."""
    ckpt = Path(ckpt)
    path = ckpt.parent / (f"{ckpt.name}.{RESULTS}" if ckpt.is_dir() else RESULTS)
    state = checkpoint_state(ckpt)
    results = {**results, 'nanohfa': {**results['nanohfa'], 'checkpoint_state': state}}
    try:
        saved = json.loads(path.read_text()) if path.exists() else None
    except (OSError, ValueError):
        saved = {}  # unreadable: kept as it is, the new results written beside it
    if saved is None:
        return path, results
    record = saved.get('nanohfa') if isinstance(saved, dict) and isinstance(saved.get('nanohfa'), dict) else {}
    if record.get('checkpoint_state') == state and isinstance(saved.get('results'), dict):
        merged = merge(saved, results)
        tasks = list(record.get('tasks') or []) + [t for t in results['nanohfa']['tasks'] if t not in (record.get('tasks') or [])]
        merged['nanohfa'] = {**results['nanohfa'], 'tasks': tasks}
        return path, merged
    return path.with_name(f"{path.stem}_{time.strftime('%Y%m%dT%H%M%S')}.json"), results


def save(results, output_path, model_name):
    """eval.py --output_path, as lm-eval's CLI takes it (its EvaluationTracker): a path ending in .json
    is a file (<stem>_<date>.json beside it), anything else a folder (<folder>/<model>/results_<date>.json).
    Returns the file written."""
    from lm_eval.loggers import EvaluationTracker
    tracker = EvaluationTracker(output_path=str(output_path))
    tracker.general_config_tracker.log_experiment_args(model_source='nanohfa', model_args={'path': model_name},
                                                       system_instruction=None, chat_template=None,
                                                       fewshot_as_multiturn=False)
    path = Path(output_path)
    if path.exists() and not path.is_dir() and path.suffix != '.json':
        raise UserError(f"--output_path {path} is a file, not a folder; give a folder, or a path ending in .json")
    tracker.save_results_aggregated(results=results, samples=None)
    written = path.with_name(f"{path.stem}_{tracker.date_id}.json") if path.suffix == '.json' else \
        path / tracker.general_config_tracker.model_name_sanitized / f"results_{tracker.date_id}.json"
    if not written.is_file():  # lm-eval logs a failure to write and goes on
        raise UserError(f"could not write the results to {written}; check that its folder can be written")
    return written


# -----------------------------------------------------------------------------
# what a name evaluates, and the key its results are reused under

@dataclasses.dataclass
class Unit:
    """One name given: the columns it fills, what its results depend on, or why it cannot be loaded."""
    name: str
    columns: list = dataclasses.field(default_factory=list)
    material: dict = dataclasses.field(default_factory=dict)
    error: str = ''


def columns_of(item):
    """The result names a task or group reports: a group with an aggregate its own, else its members'."""
    if isinstance(item, Group):
        return [item.name] if item.has_aggregation else [c for child in item for c in columns_of(child)]
    return [item.task_name]


def build_unit(name, manager):
    """A name's tasks built as lm-eval builds them (their data loaded), to read their resolved configs."""
    try:
        built = manager.load([name])
    except Exception as e:
        return Unit(name, error=f"{name} could not be loaded: {failure_line(e)}")
    group = built['groups'].get(name)
    columns = columns_of(group) if group else [t for t in built['tasks']]
    material = {'tasks': {t: task.dump_config() for t, task in built['tasks'].items()},
                'groups': {g: {'members': grp.child_names, 'aggregate': grp.aggregate_metric_list,
                               'metadata': grp.metadata} for g, grp in built['groups'].items()}}
    return Unit(name, columns, material)


def stable(obj):
    """JSON for what json cannot write, the same in every process: dataclasses as dicts, functions
    as their source, anything else as its repr without memory addresses."""
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    if callable(obj):
        import inspect
        try:
            return inspect.getsource(obj)
        except (OSError, TypeError):
            pass
    return re.sub(r' at 0x[0-9a-fA-F]+', '', repr(obj))


def unit_key(unit, ckpt, request, model_args):
    st = Path(ckpt).stat()
    what = {'lm_eval': lm_eval.__version__, 'tasks': unit.material, 'model_args': resolved(model_args),
            'limit': request['limit'], 'num_fewshot': request['num_fewshot'],
            'checkpoint': [st.st_size, st.st_mtime_ns]}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=stable).encode()).hexdigest()


def merge(old, new):
    """Two lm-eval results dicts as one: the per-task parts joined, the rest the newer one's."""
    out = {**old, **{k: v for k, v in new.items() if k not in PER_TASK}}
    for k in PER_TASK:
        if k in old or k in new:
            out[k] = {**old.get(k, {}), **new.get(k, {})}
    return out


def evaluate_run(run_dir, units, manager, request, model_args, label):
    """(lm-eval's results of a run, {name: why} for the names that failed): a name's saved results
    are reused while its key holds; the others are evaluated one name at a time, into the saved file."""
    path, ckpt = Path(run_dir) / RESULTS, Path(run_dir) / 'ckpt.pt'
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        saved = {}
    record = saved.get('nanohfa') if isinstance(saved.get('nanohfa'), dict) else {}
    have = dict(record.get('units') or {})
    failed = {n: u.error for n, u in units.items() if u.error}
    keys = {n: unit_key(u, ckpt, request, model_args) for n, u in units.items() if not u.error}
    todo = [n for n, k in keys.items() if have.get(n) != k]
    if todo:
        print(f"lm-eval: {label} on {', '.join(todo)}", flush=True)
        try:
            lm = NanoHFA(path=str(run_dir), **model_args)
        except Exception as e:
            failed.update({n: failure_line(e) for n in todo})
            todo = []
        for n in todo:
            have.pop(n, None)
            try:
                saved = merge(saved, run_tasks(lm, [n], manager, request['limit'], request['num_fewshot'], False))
                have[n] = keys[n]
            except Exception as e:
                failed[n] = failure_line(e)
        if todo:
            note_cuts(lm)
            saved['nanohfa'] = {'checkpoint': str(ckpt), 'lm_eval': lm_eval.__version__,
                                'model_args': resolved(model_args), 'units': have, **request}
            write_results(saved, path)
    valid = [n for n, k in keys.items() if have.get(n) == k]
    return {'results': {c: saved['results'][c] for n in valid for c in units[n].columns if c in saved['results']}}, failed


# -----------------------------------------------------------------------------
# the held-out loss in bits per byte

SAMPLE_TOKENS = 100_000_000  # a larger val split: this many of its tokens, in 100 evenly spaced pieces


def token_bytes(enc):
    """UTF-8 bytes of each token id (GPT-2's end-of-text: none), as a numpy array."""
    import numpy as np
    if enc.name == 'gpt2':
        lengths = [len(enc.enc.decode_single_token_bytes(i)) for i in range(enc.vocab_size)]
        lengths[enc.eot] = 0
    else:
        lengths = [len(c.encode('utf-8')) for c in enc.itos]
    return np.array(lengths, dtype=np.int64)


@functools.lru_cache
def bytes_per_token(folder):
    """(UTF-8 bytes per token of a dataset's held-out split, 'recorded' / 'counted' / 'sampled', how):
    the bytes of the text the split was made of where its preparation recorded them (meta.json
    val_bytes), else each token's bytes counted (all of them, or SAMPLE_TOKENS evenly spaced); any
    layout data.py reads (val.bin, our shards, llm.c's headered shards, uint16 or uint32). (None, '',
    why) where the split or its tokenizer is not to be had."""
    import numpy as np
    from nanohfa import data
    try:
        meta = data.read_meta(folder)
        tokens = data.split_tokens(folder, 'val', 0)
    except UserError as e:
        return None, '', str(e)
    n = len(tokens)
    if meta and meta.get('val_bytes') and meta.get('val_tokens') == n:
        return meta['val_bytes'] / n, 'recorded', (f"{meta['val_bytes']:,} UTF-8 bytes of the val text, recorded when "
                                                   f"it was prepared (meta.json val_bytes), over its {n:,} tokens")
    if meta is None and tokens.magic == 20240801:
        return None, '', f"{folder}: uint32 tokens and no meta.json: their tokenizer is not known"
    try:
        enc = tok.from_meta(meta or {'tokenizer': 'gpt2'})  # no meta: nanoGPT's GPT-2 tokens
    except UserError as e:
        return None, '', str(e)
    lengths = token_bytes(enc)
    step = max(1, n // 100)
    pieces = [(0, n)] if n <= SAMPLE_TOKENS else \
        [(i * step, i * step + SAMPLE_TOKENS // 100) for i in range(100)]
    total = counted = 0
    for a, b in pieces:
        ids = np.asarray(tokens[a:b], dtype=np.int64)
        if ids.size and ids.max() >= len(lengths):
            return None, '', f"{folder}: token id {int(ids.max()):,} is outside the tokenizer's {len(lengths):,}"
        total, counted = total + int(lengths[ids].sum()), counted + len(ids)
    kind = 'counted' if counted == n else 'sampled'
    how = f"each of its {n:,} tokens" if kind == 'counted' else f"{counted:,} of its {n:,} tokens, in 100 evenly spaced pieces"
    return total / counted, kind, (f"UTF-8 bytes per token counted over {how}"
                                   + " (GPT-2's end-of-text: no bytes)" * (enc.name == 'gpt2'))


# -----------------------------------------------------------------------------
# compare.py --eval_tasks

# the one number per task in the table: the first of these it reports
HEADLINE = ('acc_norm', 'acc', 'exact_match', 'bits_per_byte', 'perplexity', 'word_perplexity')


def headline(task_results):
    """(metric, value) the table shows for one task's (or group's) results."""
    for m in HEADLINE:
        if isinstance(task_results.get(f'{m},none'), (int, float)):
            return m, float(task_results[f'{m},none'])
    found = [(k.split(',')[0], v) for k, v in task_results.items()
             if isinstance(v, (int, float)) and ',' in k and '_stderr' not in k]
    return found[0] if found else (None, float('nan'))


def check_request(args):
    """compare.py, before the grid trains: the task names lm-eval knows, the model arguments valid."""
    task_list(args.eval_tasks, args.eval_include_path)
    parse_model_args(args.eval_model_args)


def f(x):
    return '-' if x is None or math.isnan(x) else f'{x:.4f}'


def delta_text(delta, half):
    return '-' if math.isnan(delta) else f"{delta:+.4f} [{f(delta - half)}, {f(delta + half)}]"


def grid_table(args, rows):
    """compare.py --eval_tasks: lm-eval's tasks on every finished run, each column's headline metric
    added to `rows` with mean, std and 95% CI over seeds and the difference against SA paired by
    seed; the held-out loss also in bits per byte. A name that fails on a run leaves that cell out
    and is listed (rows' `eval_failed`). Returns the markdown table."""
    from nanohfa import data
    from nanohfa.grid import REFERENCE, mean_std_ci
    names, manager = task_list(args.eval_tasks, args.eval_include_path)
    model_args = parse_model_args(args.eval_model_args)
    request = {'include_path': str(args.eval_include_path or ''), 'limit': args.eval_limit, 'num_fewshot': None}
    units = {n: build_unit(n, manager) for n in names}
    per_seed = {}  # variant -> {column: {seed: value}}
    metric = {}    # column name -> its headline metric
    sources = {}   # bits per byte: how each data folder's bytes were had
    for r in rows:
        cols = per_seed.setdefault(r['variant'], {})
        r['eval_failed'] = []
        folder = data.folder_of(r['config']['data_dir'], r['config']['dataset'])
        bpt, kind, how = bytes_per_token(str(folder))
        sources[str(folder)] = (kind, how)
        r['val bits/byte source'] = how
        for run in r['runs']:
            run_dir = Path(args.out) / 'runs' / r['variant'] / f"seed{run['seed']}"
            if bpt:  # nats per token -> bits per byte
                cols.setdefault('val bits/byte', {})[run['seed']] = run['val_loss'] / math.log(2) / bpt
            if not (run_dir / 'ckpt.pt').is_file():
                continue  # kept in results.json, its folder gone: nothing to evaluate
            res, failed = evaluate_run(run_dir, units, manager, request, model_args,
                                       f"{r['variant']} seed {run['seed']}")
            r['eval_failed'] += [{'seed': run['seed'], 'task': n, 'error': why} for n, why in failed.items()]
            for c, values in res['results'].items():
                m, value = headline(values)
                if m:
                    metric.setdefault(c, m)
                    cols.setdefault(c, {})[run['seed']] = value
    columns = ['val bits/byte'] * any('val bits/byte' in cols for cols in per_seed.values()) + \
        [c for u in units.values() for c in (u.columns or [u.name])]
    label = {c: f'{c} {metric[c]}' if c in metric else c for c in columns}
    ref = per_seed.get(REFERENCE, {})
    for r in rows:  # flat keys: results.csv gets a column each; the per-seed values go into the runs
        for c in columns:
            k, vals = label[c], per_seed[r['variant']].get(c, {})
            paired = [v - ref[c][s] for s, v in vals.items() if s in ref.get(c, {})]
            r[f'{k} mean'], r[f'{k} std'], r[f'{k} ci95'] = mean_std_ci(list(vals.values()))
            r[f'{k} n'] = len(vals)
            r[f'{k} delta_vs_sa'], _, r[f'{k} delta_ci95'] = \
                mean_std_ci(paired) if r['variant'] != REFERENCE else (float('nan'),) * 3
            for run in r['runs']:
                run[k] = vals.get(run['seed'])
    kinds = sorted({kind for kind, _ in sources.values() if kind})
    bpb = ('Held-out loss in bits per byte: nats/token ÷ ln 2 ÷ the UTF-8 bytes per token of the val split ('
           + '; '.join(f"{folder}: {how}" for folder, (_, how) in sources.items()) + '), one unit for character and '
           'BPE runs.') if 'val bits/byte' in columns else \
        'No held-out bits per byte: ' + '; '.join(how for _, how in sources.values()) + '.'
    header = {c: f"val bits/byte [{'/'.join(kinds)}]" if c == 'val bits/byte' else label[c] for c in columns}
    lines = [f"lm-eval {lm_eval.__version__} tasks ({', '.join(names)}"
             f"{f', limit {args.eval_limit}' if args.eval_limit else ''}) on every finished run: each task's headline "
             f"metric (a group's own aggregate where it has one), mean ± std over seeds [95% CI], (n=k) where fewer "
             f"seeds than the row's have the number; Δ vs {REFERENCE} paired by seed (mean of the per-seed "
             f"differences [95% CI]). {bpb}", '',
             '| variant | seeds | val loss (nats/token) | ' + ' | '.join(f'{header[c]} | Δ vs SA' for c in columns) + ' |',
             '|---|---|---|' + '---|---|' * len(columns)]
    for r in rows:
        cells = []
        for k in (label[c] for c in columns):
            n, mean, half = r[f'{k} n'], r[f'{k} mean'], r[f'{k} ci95']
            fewer = f" (n={n})" if n < r['n_seeds'] else ''
            cells += ['-', '-'] if not n else [f"{f(mean)} ± {f(r[f'{k} std'])} [{f(mean - half)}, {f(mean + half)}]"
                                               f"{fewer}", delta_text(r[f'{k} delta_vs_sa'], r[f'{k} delta_ci95'])]
        lines.append(f"| {r['variant']} | {r['n_seeds']} | {f(r['val_loss_mean'])} ± {f(r['val_loss_std'])} | "
                     + ' | '.join(cells) + ' |')
    failed = [(r['variant'], x) for r in rows for x in r['eval_failed']]
    if failed:
        lines += ['', f"lm-eval FAILED ({len(failed)}), those cells left out:"]
        lines += [f"- {v} seed {x['seed']}, {x['task']}: {x['error']}" for v, x in failed]
    return '\n'.join(lines)
