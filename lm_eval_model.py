"""
Our checkpoints as an lm-evaluation-harness model: any attention variant, any kernel, as it is
(no conversion to Hugging Face's format, which HFA and HyperAttention would not survive).

    import lm_eval, lm_eval_model          # importing registers the model as 'nanohfa'
    lm_eval.simple_evaluate(model='nanohfa', model_args='path=out-x', tasks=['wikitext'])

`path` is an out_dir (its ckpt.pt), a checkpoint file (ours, nanoGPT's, an FSDP run's), or what
init_from accepts for GPT-2's weights (a name in the Hugging Face cache, or a folder written by
save_pretrained). The tokenizer is the checkpoint's own (its character table, or GPT-2's BPE
through tiktoken); `meta=` reads a nanoGPT checkpoint's, as sample.py's --meta.

How each request type is computed (lm-eval's rules, through its own helpers):
- loglikelihood: context + continuation in one forward; the continuation's log-probability and
  whether every one of its tokens is the argmax. Longer than block_size + 1 tokens, the input is
  cut from the left (the context loses its start), as lm-eval's HF model does; a note says how
  many were cut. Requests are sorted by length and batched (right padding: causal models).
- loglikelihood_rolling: a document in windows of block_size predicted tokens
  (lm_eval.utils.get_rolling_token_windows, context_len=1): disjoint windows, every token
  predicted once, the first from the end-of-text token, the last window given a full context.
- generate_until: the model's own KV-cache decoding (GPT.generate, as sample.py), cut at the first
  stop string (the task's `until`, plus end-of-text for GPT-2); greedy unless the task asks to
  sample (do_sample, temperature, top_k). The context keeps its last block_size - max_gen_toks tokens.
A character model has no end-of-text token: the newline stands in for it (where a document
starts, and the dummy first context of rolling windows).
"""

import difflib
import functools
import json
import math
import os
import sys
from pathlib import Path

import hub

hub.online()  # before lm_eval imports datasets: offline, Hub lookups then fail at once instead of retrying

_env = set(os.environ)
import lm_eval  # noqa: E402 (after the probe)
import sklearn  # noqa: E402, F401 (lm-eval's metrics import it during an evaluation)

for _name in set(os.environ) - _env:  # both set flags for the process at import (a Hub download setting,
    del os.environ[_name]             # an OpenMP one): the environment stays the user's
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from lm_eval.api.model import TemplateLM  # noqa: E402
from lm_eval.api.registry import register_model  # noqa: E402
from lm_eval.models.utils import (Collator, handle_stop_sequences, normalize_gen_kwargs,  # noqa: E402
                                  postprocess_generated_text)
from lm_eval.tasks import TaskManager  # noqa: E402
from lm_eval.utils import get_rolling_token_windows, handle_non_serializable, make_disjoint_window  # noqa: E402
from tqdm import tqdm  # noqa: E402

import checkpoint  # noqa: E402
import devices  # noqa: E402
import tokenizer as tok  # noqa: E402
from errors import UserError  # noqa: E402


def load(path, meta='', kernel=''):
    """(model, tokenizer, checkpoint path) for an out_dir, a checkpoint file or GPT-2's weights."""
    p = Path(path)
    if p.is_dir() and (p / 'ckpt.pt').is_file():
        p = p / 'ckpt.pt'
    elif p.is_dir() and not (p / 'config.json').is_file():
        raise UserError(f"{path} holds no ckpt.pt (nor a Hugging Face config.json); train first, or give the "
                        f"out_dir of a finished run")
    if checkpoint.init_kind(str(p), ('gpt2', 'file')) == 'gpt2':
        return checkpoint.load_gpt2(str(p)), tok.GPT2Tokenizer(), p
    ckpt = checkpoint.load_checkpoint(p)
    model = checkpoint.model_from_checkpoint(ckpt, p, dropout=0.0, **({'kernel': kernel} if kernel else {}))
    return model, tok.from_meta(checkpoint.checkpoint_meta(ckpt, p, meta)), p


@register_model('nanohfa')
class NanoHFA(TemplateLM):
    def __init__(self, path='', model=None, enc=None, meta='', kernel='', device='auto', dtype='auto',
                 batch_size=16, max_batch_size=None, max_gen_toks=256, unknown_chars='error', **unknown):
        super().__init__()
        if unknown:
            raise UserError(f"unknown model_args {', '.join(unknown)} for the nanohfa model; valid: path, meta, "
                            f"kernel, device, dtype, batch_size, max_gen_toks, unknown_chars")
        if model is None:
            model, enc, path = load(path, meta, kernel)
        if not model.config.causal:
            raise UserError(f"{path} is a non-causal model (causal=False): it sees the tokens it predicts, so "
                            f"its log-likelihoods mean nothing; evaluate a causal (language) model")
        if unknown_chars not in ('error', 'drop'):
            raise UserError(f"unknown_chars={unknown_chars!r}; valid: error, drop")
        self._device = devices.pick_device(device or 'auto')
        self.dtype, self.ctx = devices.pick_dtype(dtype, self._device)
        self.model, self.enc, self.path = model.eval().to(self._device), enc, str(path)
        self.block_size = model.config.block_size
        self.batch_size = 16 if batch_size in (None, 'auto') or str(batch_size).startswith('auto') else int(batch_size)
        self.max_gen_toks, self.unknown_chars = int(max_gen_toks), unknown_chars
        self.truncated = 0  # loglikelihood requests cut from the left to fit block_size

    # -------------------------------------------------------------------------
    # tokens

    @property
    def eot_token_id(self):
        if self.enc.name == 'gpt2':
            return self.enc.eot
        return self.enc.stoi.get('\n', 0)  # a character model has no end-of-text: its line break stands in

    @property
    def max_length(self):
        return self.block_size

    @property
    def tokenizer_name(self):
        return f"nanohfa-{self.enc.name}-{self.enc.vocab_size}"

    def tok_encode(self, string, add_special_tokens=None, **kwargs):
        if self.enc.name == 'char' and self.unknown_chars == 'drop':
            string = ''.join(c for c in string if c in self.enc.stoi)
        try:
            return self.enc.encode(string)
        except UserError as e:  # a character the model never saw cannot be scored
            raise UserError(f"{e} (the task's text has them); unknown_chars=drop (eval.py "
                            f"--unknown_chars=drop) scores the text without them") from None

    def tok_decode(self, ids):
        return self.enc.decode(ids)

    # -------------------------------------------------------------------------
    # scoring

    @torch.no_grad()
    def log_probs(self, x):
        """Log-probabilities of the next token at every position of x (B, T), in float32."""
        with self.ctx:  # targets make forward return every position's logits (its loss is not used)
            logits, _ = self.model(x, targets=x)
        return F.log_softmax(logits.float(), dim=-1)

    def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
        """[(logprob, is_greedy)] of each ((context, continuation), context ids, continuation ids)."""
        order = Collator(requests, sort_fn=lambda r: (-len(r[1] + r[2]), tuple(r[1] + r[2])))
        out = []
        bar = tqdm(total=len(requests), disable=disable_tqdm, desc="loglikelihood requests")
        for batch in order.get_batched(n=self.batch_size):
            longest = max(len(k) for _, _, k in batch)
            if longest > self.block_size:  # nothing left of the context to cut: it cannot be scored
                raise UserError(f"a continuation of {longest} tokens is longer than this model's block_size="
                                f"{self.block_size}; it cannot be scored (a task for longer-context models)")
            # the input is context + continuation but its last token; too long, its start is cut
            inputs = [(c + k)[-(self.block_size + 1):][:-1] for _, c, k in batch]
            self.truncated += sum(len(c) + len(k) > self.block_size + 1 for _, c, k in batch)
            width = max(len(i) for i in inputs)
            x = torch.tensor([i + [0] * (width - len(i)) for i in inputs], device=self.device)
            logp = self.log_probs(x)
            for (key, _, cont), inp, lp in zip(batch, inputs, logp):
                lp = lp[len(inp) - len(cont):len(inp)]  # the positions that predict the continuation
                target = torch.tensor(cont, device=self.device)
                answer = (lp.gather(1, target[:, None]).sum().item(), bool((lp.argmax(-1) == target).all()))
                if key is not None:
                    self.cache_hook.add_partial('loglikelihood', key, answer)
                out.append(answer)
            bar.update(len(batch))
        bar.close()
        return order.get_original(out)

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        windows, owner = [], []
        for n, (text,) in enumerate(tqdm([r.args for r in requests], disable=disable_tqdm, desc="rolling windows")):
            for context, pred in map(make_disjoint_window, get_rolling_token_windows(
                    token_list=self.tok_encode(text), prefix_token=self.eot_token_id,
                    max_seq_len=self.block_size, context_len=1)):
                windows.append((None, context, pred))
                owner.append(n)
        totals = [0.0] * len(requests)
        for n, (logprob, _) in zip(owner, self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)):
            totals[n] += logprob
        for r, total in zip(requests, totals):
            self.cache_hook.add_partial('loglikelihood_rolling', r.args, total)
        return totals

    # -------------------------------------------------------------------------
    # generation

    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm=False):
        eos = self.enc.decode([self.enc.eot]) if self.enc.name == 'gpt2' else None
        out = []
        for context, gen_kwargs in tqdm([r.args for r in requests], disable=disable_tqdm, desc="generate_until"):
            kw = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
            until, n_new = handle_stop_sequences(kw.pop('until', None), eos=eos), kw.pop('max_gen_toks')
            if n_new >= self.block_size:
                raise UserError(f"the task asks for max_gen_toks={n_new} tokens, not fewer than this model's "
                                f"block_size={self.block_size}; give a smaller max_gen_toks (--gen_kwargs)")
            ids = self.tok_encode(context)[-(self.block_size - n_new):] or [self.eot_token_id]
            temperature = kw.get('temperature', 0.0) if kw.get('do_sample') else 0.0
            x = torch.tensor([ids], device=self.device)
            with self.ctx:
                y = self.model.generate(x, n_new, temperature=temperature, top_k=kw.get('top_k') or None)
            text = postprocess_generated_text(self.enc.decode(y[0, len(ids):].tolist()), until, None)
            self.cache_hook.add_partial('generate_until', (context, gen_kwargs), text)
            out.append(text)
        return out

    def get_model_info(self):
        return {'path': self.path, 'params': self.model.get_num_params(), 'attention': self.model.config.attention,
                'kernel': self.model.config.kernel, 'block_size': self.block_size, 'tokenizer': self.tokenizer_name,
                'dtype': self.dtype}


def note_truncated(lm):
    """One line on stderr, if any context was longer than block_size."""
    if lm.truncated:
        print(f"note: {lm.truncated} request(s) longer than block_size={lm.block_size} tokens were cut from the "
              f"left (their context's start), as lm-eval's HF model does", file=sys.stderr)


# -----------------------------------------------------------------------------
# running tasks: eval.py's command, and compare.py --eval_tasks on every run of a grid

RESULTS = 'lm_eval_results.json'  # beside the checkpoint


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


def evaluate(path, tasks, include_path='', limit=None, num_fewshot=None, bar=True, **model_args):
    """lm-eval's results dict for the checkpoint at `path` on `tasks` (names or 'a,b,c'); the
    request is recorded in it under 'nanohfa' (what compare.py checks before reusing it)."""
    lm = NanoHFA(path=path, **model_args)  # first: a bad checkpoint is told in a second, tasks may take longer
    names, manager = task_list(tasks, include_path)
    try:
        results = lm_eval.simple_evaluate(model=lm, tasks=names, num_fewshot=num_fewshot, limit=limit,
                                          task_manager=manager, log_samples=False,
                                          verbosity='WARNING' if bar else 'ERROR')
    except (OSError, ConnectionError) as e:  # a task's data not in the local cache, offline
        raise UserError(f"a task's data could not be loaded ({hub.first_line(e)})" + (
            "; offline: put its dataset in the local datasets cache (HF_DATASETS_CACHE), or give a folder of "
            "local task YAMLs with --include_path (docs/evaluation.md)" if hub.offline_now() else ''))
    note_truncated(lm)
    results['nanohfa'] = request_record(lm.path, names, include_path, limit, num_fewshot)
    return results


def request_record(path, names, include_path, limit, num_fewshot):
    p = Path(path)
    return {'checkpoint': str(p), 'checkpoint_mtime': p.stat().st_mtime if p.is_file() else None,
            'tasks': list(names), 'include_path': str(include_path or ''), 'limit': limit, 'num_fewshot': num_fewshot}


def write_results(results, path):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(results, indent=1, default=handle_non_serializable))


def cached_results(run_dir, names, include_path, limit, num_fewshot):
    """The run's saved results if they answer this very request (same checkpoint, same tasks)."""
    path = Path(run_dir) / RESULTS
    try:
        saved = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    want = request_record(Path(run_dir) / 'ckpt.pt', names, include_path, limit, num_fewshot)
    return saved if saved.get('nanohfa') == want else None


# the one number per task in the table: the first of these it reports
HEADLINE = ('acc_norm', 'acc', 'exact_match', 'bits_per_byte', 'perplexity', 'word_perplexity')


def headline(task_results):
    """(metric, value) the table shows for one task's results."""
    for m in HEADLINE:
        if isinstance(task_results.get(f'{m},none'), (int, float)):
            return m, float(task_results[f'{m},none'])
    found = [(k.split(',')[0], v) for k, v in task_results.items()
             if isinstance(v, (int, float)) and ',' in k and '_stderr' not in k]
    return found[0] if found else (None, float('nan'))


@functools.lru_cache
def bytes_per_token(folder):
    """UTF-8 bytes per token of a dataset's held-out text (val.bin): the factor from nats per
    token to bits per byte. GPT-2's end-of-text tokens count as tokens of no bytes."""
    import numpy as np
    import data
    if not (Path(folder) / 'val.bin').is_file():
        return None
    enc = tok.from_meta(data.read_meta(folder) or {'tokenizer': 'gpt2'})  # no meta: nanoGPT's GPT-2 tokens
    ids = np.memmap(Path(folder) / 'val.bin', dtype=np.uint16, mode='r')
    if enc.name == 'gpt2':
        ids = ids[ids != enc.eot]
    n_bytes = len(enc.decode(ids.tolist()).encode('utf-8'))
    return n_bytes / len(np.memmap(Path(folder) / 'val.bin', dtype=np.uint16, mode='r'))


def f(x):
    return '-' if x is None or math.isnan(x) else f'{x:.4f}'


def delta_text(delta, half):
    return '-' if math.isnan(delta) else f"{delta:+.4f} [{f(delta - half)}, {f(delta + half)}]"


def grid_table(args, rows):
    """compare.py --eval_tasks: lm-eval's tasks on every finished run (results reused while the
    checkpoint and request are unchanged), each task's headline metric added to `rows` with mean,
    std and 95% CI over seeds and the difference against SA paired by seed; the held-out loss also
    in bits per byte. Returns the markdown table."""
    import data
    from grid import REFERENCE, mean_std_ci
    names, _ = task_list(args.eval_tasks, args.eval_include_path)
    request = dict(include_path=args.eval_include_path, limit=args.eval_limit, num_fewshot=None)
    per_seed = {}  # variant -> {column: {seed: value}}
    for r in rows:
        cols = per_seed.setdefault(r['variant'], {})
        bpt = bytes_per_token(data.folder_of(r['config']['data_dir'], r['config']['dataset']))
        for run in r['runs']:
            run_dir = Path(args.out) / 'runs' / r['variant'] / f"seed{run['seed']}"
            if bpt:  # nats per token -> bits per byte
                cols.setdefault('val bits/byte', {})[run['seed']] = run['val_loss'] / math.log(2) / bpt
            if not (run_dir / 'ckpt.pt').is_file():
                continue  # kept in results.json, its folder gone: nothing to evaluate
            res = cached_results(run_dir, names, **request)
            if res is None:
                print(f"lm-eval: {r['variant']} seed {run['seed']} on {', '.join(names)}", flush=True)
                res = evaluate(run_dir, names, bar=False, **request)
                write_results(res, run_dir / RESULTS)
            for task in names:
                metric, value = headline(res['results'].get(task, {}))
                if metric:
                    cols.setdefault(f'{task} {metric}', {})[run['seed']] = value
    columns = list(dict.fromkeys(c for cols in per_seed.values() for c in cols))
    ref = per_seed.get(REFERENCE, {})
    for r in rows:  # flat keys: results.csv gets a column each; the per-seed values go into the runs
        for c in columns:
            vals = per_seed[r['variant']].get(c, {})
            paired = [v - ref[c][s] for s, v in vals.items() if s in ref.get(c, {})]
            r[f'{c} mean'], r[f'{c} std'], r[f'{c} ci95'] = mean_std_ci(list(vals.values()))
            r[f'{c} delta_vs_sa'], _, r[f'{c} delta_ci95'] = \
                mean_std_ci(paired) if r['variant'] != REFERENCE else (float('nan'),) * 3
            for run in r['runs']:
                run[c] = vals.get(run['seed'])
    lines = [f"lm-eval {lm_eval.__version__} tasks ({', '.join(names)}"
             f"{f', limit {args.eval_limit}' if args.eval_limit else ''}) on every finished run: each task's headline "
             f"metric, mean ± std over seeds [95% CI]; Δ vs {REFERENCE} paired by seed (mean of the per-seed "
             f"differences [95% CI]). Held-out loss in bits per byte: nats/token ÷ ln 2 ÷ the UTF-8 bytes per token "
             f"of val.bin, one unit for character and BPE runs.", '',
             '| variant | seeds | val loss (nats/token) | ' + ' | '.join(f'{c} | Δ vs SA' for c in columns) + ' |',
             '|---|---|---|' + '---|---|' * len(columns)]
    for r in rows:
        cells = [f"{f(r[f'{c} mean'])} ± {f(r[f'{c} std'])} [{f(r[f'{c} mean'] - r[f'{c} ci95'])}, "
                 f"{f(r[f'{c} mean'] + r[f'{c} ci95'])}] | " + delta_text(r[f'{c} delta_vs_sa'], r[f'{c} delta_ci95'])
                 for c in columns]
        lines.append(f"| {r['variant']} | {r['n_seeds']} | {f(r['val_loss_mean'])} ± {f(r['val_loss_std'])} | "
                     + ' | '.join(cells) + ' |')
    return '\n'.join(lines)
