"""lm-evaluation-harness on our checkpoints (lm_eval_model.py, eval.py, compare.py --eval_tasks),
offline, with lm-eval's own evaluator over the local tasks in tests/fixtures/lm_eval_tasks:
- the log-likelihoods lm-eval receives equal those computed directly with model.py (sa, hfa_v1, ha);
- the cross-check: a tiny GPT-2 written by transformers, evaluated through our init_from folder
  path and through lm-eval's own `hf` model, gets the same metrics and the same per-request numbers;
- generate_until is sample.py's greedy decoding, cut at the stop strings, batched as one at a time;
  it stops at a stop string or end-of-text, samples as Hugging Face's generate reads do_sample,
  temperature, top_k and top_p, and slides its window past block_size;
- unknown_chars=drop drops from contexts only, and refuses a scored text it would bias;
- a context longer than block_size is cut from the left, as documented, not an error;
- eval.py end to end, its one-line refusals, and compare.py's table of task metrics over seeds."""

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from nanohfa import lm_eval_model
from nanohfa import lm_eval_tasks
from nanohfa import tokenizer as tok
from nanohfa.errors import UserError
from model import GPT, GPTConfig
from lm_eval_fixture import ENC, GEN, MC, TASKS, TEXT, fixture_texts

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures('one_thread')


def tiny(attention, block_size=64, seed=0, scale=1.0):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(block_size=block_size, vocab_size=ENC.vocab_size, n_layer=2, n_head=2, n_embd=32,
                          attention=attention, bias=False)).eval()
    with torch.no_grad():  # scale > 1: an untrained model whose greedy text varies (at init it repeats a character)
        for p in model.parameters():
            p.mul_(scale if p.dim() == 2 else 1.0)
    return model


def save_run(model, out_dir, **extra):
    """A checkpoint as train.py writes it (the fields readers use)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    from dataclasses import asdict
    torch.save({'model': model.state_dict(), 'model_args': asdict(model.config), 'iter_num': 0, 'best_val_loss': 9.9,
                'config': {}, 'rng': {}, 'tokenizer': ENC.meta(), **extra}, out_dir / 'ckpt.pt')
    return out_dir


@pytest.fixture(scope='module')
def task_manager():
    return lm_eval_tasks.task_list([MC, TEXT, GEN], TASKS)[1]  # the local tasks alone: lm-eval's own take seconds


def run_tasks(lm, tasks, task_manager, **kw):
    import lm_eval
    return lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=task_manager, verbosity='ERROR', **kw)


# -----------------------------------------------------------------------------
# the numbers lm-eval receives, computed directly with model.py's forward

def direct(model, ctx, cont):
    """log p(cont | ctx), the input cut to block_size + 1 tokens from the left, through model.py's loss."""
    ids = (ctx + cont)[-(model.config.block_size + 1):]
    x = torch.tensor([ids[:-1]])
    y = torch.tensor([[-1] * (len(ids) - 1 - len(cont)) + cont])
    with torch.no_grad():
        return -model(x, targets=y)[1].item() * len(cont)


def direct_rolling(model, ids, first):
    """log p(document): windows of block_size predicted tokens, each token predicted once with as
    much context as fits (the first from `first`, the end-of-text stand-in)."""
    T, s, total, p = model.config.block_size, [first] + ids, 0.0, 0
    while p < len(ids):
        e = min(p + T, len(ids))
        lo = max(0, e - T)
        x, y = torch.tensor([s[lo:e]]), torch.tensor([[-1] * (p - lo) + s[p + 1:e + 1]])
        with torch.no_grad():
            total -= model(x, targets=y)[1].item() * (e - p)
        p = e
    return total


@pytest.mark.parametrize('attention', ['sa', 'linear', 'hfa_v1', 'hfa_v2', 'ha'])
def test_loglikelihoods_equal_the_model_forward(attention, task_manager):
    model = tiny(attention)
    lm = lm_eval_model.NanoHFA(model=model, enc=ENC, device='cpu', batch_size=3)
    out = run_tasks(lm, [MC, TEXT], task_manager, log_samples=True)
    correct = []
    for s in out['samples'][MC]:
        got = [resp[0][0] for resp in s['resps']]
        want = [direct(model, ENC.encode(ctx), ENC.encode(cont)) for ctx, cont in s['arguments']]
        assert got == pytest.approx(want, rel=1e-5, abs=1e-5)
        correct.append(int(np.argmax(want)) == s['doc']['answer'])
    assert out['results'][MC]['acc,none'] == pytest.approx(np.mean(correct))
    n_windows = 0
    for s in out['samples'][TEXT]:
        ids = ENC.encode(s['doc']['text'])
        n_windows += math.ceil(len(ids) / 64)
        assert s['resps'][0][0] == pytest.approx(direct_rolling(model, ids, ENC.stoi['\n']), rel=1e-5)
    assert n_windows > len(out['samples'][TEXT])  # documents longer than block_size: several windows each
    nll = -sum(s['resps'][0][0] for s in out['samples'][TEXT])
    n_bytes = sum(len(s['doc']['text'].encode()) for s in out['samples'][TEXT])
    assert out['results'][TEXT]['bits_per_byte,none'] == pytest.approx(nll / n_bytes / math.log(2), rel=1e-6)


@pytest.mark.parametrize('attention', ['hfa_v1', 'ha'])
def test_a_kernel_setting_gives_the_same_numbers(attention, tmp_path):
    """kernel= (eval.py --kernel) rebuilds the checkpoint's model with another kernel: the same scores."""
    out_dir = save_run(tiny(attention), tmp_path / 'run')
    requests = [SimpleNamespace(args=('ROMEO: But, soft! what light', ' through yonder window')),
                SimpleNamespace(args=('', 'It is the east, and Juliet is the sun.'))]
    scores = {k: lm_eval_model.NanoHFA(path=str(out_dir), kernel=k, device='cpu').loglikelihood(requests)
              for k in ('auto', 'reference')}
    assert [s for s, _ in scores['auto']] == pytest.approx([s for s, _ in scores['reference']], rel=1e-4)


def test_context_longer_than_block_size_is_cut_from_the_left(capsys):
    model = tiny('sa', block_size=32)
    lm = lm_eval_model.NanoHFA(model=model, enc=ENC, device='cpu')
    ctx = 'ROMEO: But, soft! what light through yonder window breaks? It is the east, and Juliet is the sun.'
    cont = ' Arise'
    (long_ll, _), (short_ll, _) = lm.loglikelihood([SimpleNamespace(args=(ctx, cont)),
                                                    SimpleNamespace(args=(ctx[-(33 - len(cont)):], cont))])
    assert len(ctx) > 3 * 32 and lm.truncated == 1  # the short one fits exactly: block_size + 1 tokens
    assert long_ll == pytest.approx(short_ll, rel=1e-6)
    assert long_ll == pytest.approx(direct(model, ENC.encode(ctx), ENC.encode(cont)), rel=1e-5)
    with pytest.raises(UserError, match='a continuation of 40 tokens is longer than .* block_size=32'):
        lm.loglikelihood([SimpleNamespace(args=('ROMEO:', ' ' + 'a' * 39))])  # no context left to cut
    capsys.readouterr()
    lm_eval_model.note_cuts(lm)
    note = capsys.readouterr().err
    assert note.count('\n') == 1 and 'cut from the left' in note


def test_a_nanogpt_checkpoint_scores_as_nanogpts_own_model(tmp_path):
    """nanoGPT's checkpoint (tests/fixtures: 16 symbols) through `meta=`, against the logits
    nanoGPT's own model code gave for the same tokens."""
    meta = {'tokenizer': 'char', 'vocab_size': 16, 'itos': list('abcdefghijklmnop')}
    (tmp_path / 'meta.json').write_text(json.dumps(meta))
    lm = lm_eval_model.NanoHFA(path=str(ROOT / 'tests' / 'fixtures' / 'nanogpt_ckpt.pt'), meta=str(tmp_path),
                               device='cpu')
    ref = torch.load(ROOT / 'tests' / 'fixtures' / 'nanogpt_logits.pt', weights_only=True)
    want = []
    for ids, logits in zip(ref['idx'].tolist(), ref['logits'].log_softmax(-1)):
        want.append(sum(logits[p, ids[p + 1]].item() for p in range(7, 15)))
    got = lm.loglikelihood([SimpleNamespace(args=(lm.tok_decode(ids[:8]), lm.tok_decode(ids[8:])))
                            for ids in ref['idx'].tolist()])
    assert [g[0] for g in got] == pytest.approx(want, rel=1e-5)


# -----------------------------------------------------------------------------
# the cross-check: our adapter and lm-eval's own hf model on the same tiny GPT-2

@pytest.fixture(scope='module')
def gpt2_folder(tmp_path_factory):
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter
    folder = tmp_path_factory.mktemp('gpt2') / 'gpt2-tiny'
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=8, n_positions=32, vocab_size=50257)).save_pretrained(folder)
    # the hf model's tokenizer: GPT-2's BPE built from the same tiktoken ranks (the Hub is out of reach)
    enc = tok.GPT2Tokenizer()
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=TikTokenConverter(
        vocab_file=str(tok.ensure_gpt2_ranks()), pattern=enc.enc._pat_str,
        extra_special_tokens={'<|endoftext|>': enc.eot}).converted(), eos_token='<|endoftext|>')
    texts = fixture_texts()
    assert [hf_tok.encode(t) for t in texts] == [enc.encode(t) for t in texts]
    return folder, hf_tok


CROSS_CHECK = {}  # the numbers, for the record (printed by -s)


def test_adapter_matches_lm_evals_own_hf_model(gpt2_folder, task_manager):
    from lm_eval.models.huggingface import HFLM
    folder, hf_tok = gpt2_folder
    ours = lm_eval_model.NanoHFA(path=str(folder), device='cpu', batch_size=4)
    theirs = HFLM(pretrained=str(folder), tokenizer=hf_tok, device='cpu', batch_size=4, dtype='float32')
    assert ours.block_size == theirs.max_length == 32  # the tasks' contexts and documents exceed it
    a = run_tasks(ours, [MC, TEXT, GEN], task_manager, log_samples=True)
    b = run_tasks(theirs, [MC, TEXT, GEN], task_manager, log_samples=True)
    for task in (MC, TEXT, GEN):
        for key, value in b['results'][task].items():
            if isinstance(value, float) and 'stderr' not in key:
                CROSS_CHECK[f'{task} {key}'] = (a['results'][task][key], value)
                if key.startswith(('acc', 'exact_match')):
                    assert a['results'][task][key] == value, key
                else:
                    assert a['results'][task][key] == pytest.approx(value, rel=1e-4), key
        for sa, sb in zip(a['samples'][task], b['samples'][task], strict=True):
            assert sa['arguments'] == sb['arguments']
            if task == GEN:
                assert sa['resps'] == sb['resps']  # greedy text, cut at the same stop strings
            else:
                flat = lambda s: [float(x) for r in s['resps'] for x in (r[0] if isinstance(r[0], tuple) else r)]
                assert flat(sa) == pytest.approx(flat(sb), rel=1e-4, abs=1e-6)
                worst = max(abs(x - y) / max(abs(y), 1e-9) for x, y in zip(flat(sa), flat(sb)))
                CROSS_CHECK[f'{task} per-request max rel. diff'] = (worst, worst)
    assert ours.truncated > 0  # the cut from the left was exercised, and agrees with the hf model's
    for k, (x, y) in CROSS_CHECK.items():
        print(f"| {k} | {x:.10g} | {y:.10g} | {abs(x - y) / max(abs(y), 1e-12):.1e} |")


# -----------------------------------------------------------------------------
# generation: sample.py's greedy decoding, cut at the stop strings

def test_generate_until_is_sample_greedy_cut_at_stop_strings(tmp_path):
    model = tiny('sa', seed=2, scale=20.0)
    out_dir = save_run(model, tmp_path / 'run')
    prompt = 'ROMEO:\nBut, soft! what'
    r = subprocess.run([sys.executable, 'sample.py', f'--out_dir={out_dir}', f'--start={prompt}', '--temperature=0',
                        '--max_new_tokens=24', '--num_samples=1', '--device=cpu'], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    # the sample follows the settings sample.py echoes
    greedy = r.stdout[r.stdout.index(prompt) + len(prompt):].split('\n---------------')[0]
    assert len(set(greedy)) > 5
    lm = lm_eval_model.NanoHFA(path=str(out_dir), device='cpu')
    request = lambda until: SimpleNamespace(args=(prompt, {'until': until, 'max_gen_toks': 24, 'do_sample': False}))
    stop = next(greedy[i:i + 2] for i in range(1, len(greedy) - 1) if greedy.index(greedy[i:i + 2]) == i)
    full, cut, none = lm.generate_until([request([]), request([stop]), request(['never', stop[0]])])
    assert full == greedy
    assert cut == greedy[:greedy.index(stop)] and 0 < len(cut) < len(greedy)
    assert none == greedy[:greedy.index(stop[0])]  # the first stop string met ends it


def greedy_text(model, prompt, n):
    """The model's own greedy decoding (GPT.generate, sample.py's) of n tokens after prompt."""
    ids = ENC.encode(prompt)[-(model.config.block_size - n if n < model.config.block_size else
                               model.config.block_size):]
    y = model.generate(torch.tensor([ids]), n, temperature=0)
    return ENC.decode(y[0, len(ids):].tolist())


def generation(prompt, **kw):
    return SimpleNamespace(args=(prompt, {'until': [], 'max_gen_toks': 20, 'do_sample': False, **kw}))


PROMPTS = ['ROMEO:\nBut, soft! what', 'All:\nSpeak,', 'KING RICHARD III:\nNow is the winter', 'MENENIUS:\nEither',
           'JULIET: O Romeo, Romeo, wherefore art thou']


def test_batched_generation_equals_one_request_at_a_time():
    """Prompts of five lengths in one batch: each row is decoded at its own positions, as alone."""
    model = tiny('hfa_v1', seed=2, scale=20.0)
    requests = [generation(p, until=['\n\n']) for p in PROMPTS]
    lm = lm_eval_model.NanoHFA(model=model, enc=ENC, device='cpu', batch_size=5)
    parts = lm.similar_lengths(sorted([r.args for r in requests], key=lambda a: -len(a[0])))
    assert max(len({len(c) for c, _ in part}) for part in parts) == 3  # rows of 3 prompt lengths decoded together
    batched = lm.generate_until(requests)
    alone = lm_eval_model.NanoHFA(model=model, enc=ENC, device='cpu', batch_size=1).generate_until(requests)
    assert batched == alone
    assert batched == [greedy_text(model, p, 20).split('\n\n')[0] for p in PROMPTS]
    assert len(set(batched)) == len(PROMPTS)


def count_forwards(model):
    calls = []
    model.register_forward_hook(lambda *a: calls.append(1))
    return calls


def test_generation_stops_at_the_first_stop_string():
    """The text is the greedy text cut at the stop string, and decoding ends when it appears: one
    forward for the prompt, then one per token up to the stop string's last, not max_gen_toks."""
    model = tiny('sa', seed=2, scale=20.0)
    lm = lm_eval_model.NanoHFA(model=model, enc=ENC, device='cpu')
    full = lm.generate_until([generation(PROMPTS[0], max_gen_toks=40)])[0]
    stop = next(full[i:i + 2] for i in range(3, len(full) - 1) if full.index(full[i:i + 2]) == i)
    calls = count_forwards(model)
    text, = lm.generate_until([generation(PROMPTS[0], max_gen_toks=40, until=['never', stop])])
    assert text == full[:full.index(stop)] and len(text) < 30
    assert len(calls) == full.index(stop) + len(stop)  # one token a forward (characters), the prompt's included


def test_generation_stops_at_end_of_text():
    """A GPT-2-vocabulary model whose every prediction is end-of-text: nothing generated, one forward."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, vocab_size=50304, n_layer=1, n_head=1, n_embd=8, bias=True)).eval()
    enc = tok.GPT2Tokenizer()
    with torch.no_grad():  # the final norm's output is its bias; end-of-text's embedding points along it
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.normal_()
        model.lm_head.weight[enc.eot] = 100 * model.transformer.ln_f.bias
    lm = lm_eval_model.NanoHFA(model=model, enc=enc, device='cpu')
    calls = count_forwards(model)
    assert lm.generate_until([generation('Hello', until=['never'], max_gen_toks=16)]) == ['']
    assert len(calls) == 1


def test_sampling_settings_are_read_as_hugging_faces_generate_reads_them():
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
    sampler = lm_eval_model.NanoHFA.sampler
    assert sampler({'do_sample': False, 'temperature': 0.0}) is None  # greedy
    default = sampler({'do_sample': True})  # HF's defaults: temperature 1 (no warper), top_k 50, top_p 1 (none)
    assert [type(w) for w in default] == [TopKLogitsWarper] and default[0].top_k == 50
    full = sampler({'do_sample': True, 'temperature': 0.7, 'top_k': 5, 'top_p': 0.9})
    assert [type(w) for w in full] == [TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper]
    assert (full[0].temperature, full[1].top_k, full[2].top_p) == (0.7, 5, 0.9)
    with pytest.raises(UserError, match=r'temperature=0.0; a sampling temperature must be > 0'):
        sampler({'do_sample': True, 'temperature': 0.0})
    with pytest.raises(UserError, match=r"settings \{'repetition_penalty': 1.3\} are not supported"):
        sampler({'do_sample': False, 'repetition_penalty': 1.3})


def test_do_sample_samples_and_top_k_1_is_greedy():
    """do_sample without a temperature samples (at HF's temperature 1), top_k=1 or a tiny top_p keeps
    the argmax alone, and do_sample=False with a temperature is greedy."""
    model = tiny('sa', seed=1)  # untrained: nearly flat predictions, greedy repeats one character
    lm = lm_eval_model.NanoHFA(model=model, enc=ENC, device='cpu')
    greedy = greedy_text(model, PROMPTS[1], 20)
    torch.manual_seed(0)
    sampled = lm.generate_until([generation(PROMPTS[1], do_sample=True)] * 3)
    assert all(s != greedy for s in sampled) and len(set(sampled)) == 3
    for kw in ({'do_sample': True, 'top_k': 1}, {'do_sample': True, 'top_p': 1e-9}, {'do_sample': False,
                                                                                    'temperature': 0.8}):
        assert lm.generate_until([generation(PROMPTS[1], **kw)]) == [greedy], kw


def test_max_gen_toks_beyond_block_size_slides_the_window(capsys):
    """A task asking for more tokens than block_size: the context keeps its last block_size tokens and
    each new token is predicted from the last block_size, as sample.py decodes past block_size."""
    model = tiny('sa', block_size=16, seed=2, scale=20.0)
    lm = lm_eval_model.NanoHFA(model=model, enc=ENC, device='cpu')
    texts = lm.generate_until([generation(p, max_gen_toks=40) for p in PROMPTS[:2]])
    assert texts == [greedy_text(model, p, 40) for p in PROMPTS[:2]] and all(len(t) == 40 for t in texts)
    lm_eval_model.note_cuts(lm)
    assert 'note: 2 generation request(s) asked for max_gen_toks >= block_size=16' in capsys.readouterr().err


# -----------------------------------------------------------------------------
# eval.py: one command, and one line for bad input

@pytest.mark.slow
def test_eval_py_writes_results_beside_the_checkpoint_in_under_a_minute(tmp_path):
    out_dir = save_run(tiny('hfa_v1'), tmp_path / 'run')
    t0 = time.time()
    r = subprocess.run([sys.executable, 'eval.py', f'--out_dir={out_dir}', f'--tasks={MC},{TEXT},{GEN}',
                        f'--include_path={TASKS}', '--device=cpu'], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert time.time() - t0 < 60
    results = json.loads((out_dir / lm_eval_tasks.RESULTS).read_text())
    assert set(results['results']) == {MC, TEXT, GEN} and results['nanohfa']['tasks'] == [MC, TEXT, GEN]
    assert 0 <= results['results'][MC]['acc,none'] <= 1 and results['results'][TEXT]['bits_per_byte,none'] > 0
    assert f'|{MC}' in r.stdout and f"wrote {out_dir / lm_eval_tasks.RESULTS}" in r.stdout


def test_eval_refuses_bad_input_in_one_line(tmp_path):
    import eval as eval_py
    out_dir = save_run(tiny('sa'), tmp_path / 'run', tokenizer=None)  # no tokenizer, no dataset named
    with pytest.raises(UserError, match=r"vocabulary of \d+ tokens but GPT-2's tokenizer .* give that data's meta"):
        eval_py.main([f'--out_dir={out_dir}', f'--tasks={MC}', f'--include_path={TASKS}'])
    with pytest.raises(UserError, match='no ckpt.pt'):
        eval_py.main([f'--out_dir={tmp_path}', f'--tasks={MC}'])
    with pytest.raises(UserError, match=f'--out_dir {tmp_path}/nowhere: no such folder; give the out_dir of a training'):
        eval_py.main([f'--out_dir={tmp_path}/nowhere', f'--tasks={MC}'])
    with pytest.raises(UserError, match=r'^no checkpoint at nowhere: give the out_dir of a training run'):
        eval_py.main(['--init_from=nowhere', f'--tasks={MC}'])
    with pytest.raises(UserError, match=r'^unrecognized argument\(s\) --taks=x \(--taks: did you mean --tasks\?\)'):
        eval_py.main([f'--out_dir={out_dir}', '--taks=x'])  # the misspelt flag, not a missing --tasks
    with pytest.raises(UserError, match='--tasks is required'):
        eval_py.main([f'--out_dir={out_dir}'])
    with pytest.raises(UserError, match='one of them'):
        eval_py.main([f'--tasks={MC}'])
    save_run(tiny('sa'), out_dir)
    with pytest.raises(UserError, match=r"unknown lm-eval task\(s\) nanohfa_tiny_mcq \(nanohfa_tiny_mcq: did you mean "
                                        r"nanohfa_tiny_mc"):
        eval_py.main([f'--out_dir={out_dir}', '--tasks=nanohfa_tiny_mcq', f'--include_path={TASKS}'])


def test_characters_outside_the_vocabulary_are_named_with_both_flags(task_manager):
    small = tok.CharTokenizer(sorted(set('abcdefghijklmnopqrstuvwxyz \n')))
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=small.vocab_size, n_layer=1, n_head=1, n_embd=8))
    with pytest.raises(UserError, match=r"not in this model's character vocabulary.*eval.py --unknown_chars=drop; "
                                        r"compare.py --eval_model_args=unknown_chars=drop"):
        run_tasks(lm_eval_model.NanoHFA(model=model, enc=small, device='cpu'), [MC], task_manager, limit=1)


def test_drop_leaves_unknown_characters_out_of_contexts_and_refuses_them_in_scored_text():
    """unknown_chars=drop: a prompt's unknown characters are dropped (the score is the prompt's without
    them); a choice or a document holding one is refused, not scored on fewer characters than
    lm-eval's byte, word and length counts (the bias: bits per byte too good, an all-unknown choice at 0)."""
    model = tiny('sa')
    lm = lm_eval_model.NanoHFA(model=model, enc=ENC, device='cpu', unknown_chars='drop')
    assert '€' not in ENC.stoi and '#' not in ENC.stoi
    (dropped, _), (clean, _) = lm.loglikelihood([SimpleNamespace(args=('ROMEO: # But, soft€!', ' what light')),
                                                 SimpleNamespace(args=('ROMEO:  But, soft!', ' what light'))])
    assert dropped == clean
    with pytest.raises(UserError, match=r"characters '€' are in a text this task scores"):
        lm.loglikelihood([SimpleNamespace(args=('ROMEO: But, soft!', ' €€')), SimpleNamespace(args=('ROMEO:', ' a'))])
    with pytest.raises(UserError, match=r"characters '#' are in a text this task scores"):
        lm.loglikelihood_rolling([SimpleNamespace(args=('All:\nSpeak, # speak.',))])
    lm.generate_until([SimpleNamespace(args=('ROMEO: # But€', {'until': ['\n'], 'max_gen_toks': 4}))])  # a prompt: dropped


# -----------------------------------------------------------------------------
# compare.py --eval_tasks: the task metrics over seeds, paired against SA

TINY = """
device = 'cpu'
eval_interval = 3
eval_iters = 2
log_interval = 1
gradient_accumulation_steps = 1
batch_size = 4
block_size = 32
n_layer = 1
n_head = 2
n_embd = 16
learning_rate = 1e-2
max_iters = 3
lr_decay_iters = 3
warmup_iters = 1
"""


@pytest.mark.slow
def test_compare_adds_task_metrics_with_paired_differences(tmp_path, capsys):
    import compare
    data_dir = tmp_path / 'data'
    data_dir.mkdir()
    ids = np.array(ENC.encode('\n\n'.join(fixture_texts()) * 4), dtype=np.uint16)
    ids.tofile(data_dir / 'train.bin')
    ids[:2000].tofile(data_dir / 'val.bin')
    (data_dir / 'meta.json').write_text(json.dumps(ENC.meta()))
    (tmp_path / 'tiny.py').write_text(TINY)
    argv = ['--config', str(tmp_path / 'tiny.py'), f'--data_dir={data_dir}', '--variants', 'sa,hfa', '--seeds', '2',
            '--out', str(tmp_path / 'grid'), '--jobs', '2', '--threads', '1',
            '--eval_tasks', f'{MC},{TEXT}', '--eval_include_path', str(TASKS), '--eval_limit', '3']
    assert compare.main(argv) == 0
    first = capsys.readouterr().out
    assert first.count('lm-eval: ') == 4  # every run evaluated once
    rows = {r['variant']: r for r in json.loads((tmp_path / 'grid' / 'results.json').read_text())}
    for r in rows.values():  # char data, ASCII: one byte per token
        assert r['val bits/byte mean'] == pytest.approx(r['val_loss_mean'] / math.log(2), rel=1e-9)
        for run in r['runs']:
            saved = json.loads((tmp_path / 'grid' / 'runs' / r['variant'] / f"seed{run['seed']}" /
                                lm_eval_tasks.RESULTS).read_text())
            assert run[f'{MC} acc_norm'] == saved['results'][MC]['acc_norm,none']
            assert run[f'{TEXT} bits_per_byte'] == saved['results'][TEXT]['bits_per_byte,none']
    col = f'{TEXT} bits_per_byte'
    diffs = [h[col] - s[col] for h, s in zip(rows['hfa']['runs'], rows['sa']['runs'], strict=True)]
    assert rows['hfa'][f'{col} delta_vs_sa'] == pytest.approx(np.mean(diffs))
    assert rows['hfa'][f'{col} mean'] == pytest.approx(np.mean([run[col] for run in rows['hfa']['runs']]))
    table = (tmp_path / 'grid' / 'results.md').read_text()
    assert f'| {MC} acc_norm | Δ vs SA |' in table and '| val bits/byte [counted] |' in table  # counted: no val_bytes in this meta.json
    # a --collect_only pass reuses the saved results while the checkpoints are unchanged
    assert compare.main(argv + ['--collect_only']) == 0
    again = capsys.readouterr().out
    assert 'lm-eval: ' not in again and table.splitlines()[-1] in again


def fake_results(tasks, ckpt):
    return {'results': {t: {'acc,none': 0.5} for t in tasks}, 'configs': {t: {} for t in tasks},
            'nanohfa': {'checkpoint': str(ckpt), 'tasks': list(tasks)}}


def test_a_second_evaluation_of_the_same_weights_merges_by_task(tmp_path):
    run = save_run(tiny('sa'), tmp_path / 'run')
    path, first = lm_eval_tasks.default_results(fake_results([MC, TEXT], run / 'ckpt.pt'), run / 'ckpt.pt')
    assert path == run / lm_eval_tasks.RESULTS
    lm_eval_tasks.write_results(first, path)
    again = fake_results([TEXT, GEN], run / 'ckpt.pt')
    again['results'][TEXT]['acc,none'] = 0.75
    path2, merged = lm_eval_tasks.default_results(again, run / 'ckpt.pt')
    assert path2 == path and set(merged['results']) == {MC, TEXT, GEN}
    assert merged['results'][TEXT]['acc,none'] == 0.75 and merged['nanohfa']['tasks'] == [MC, TEXT, GEN]


def test_results_of_other_weights_are_kept_and_the_new_ones_dated(tmp_path):
    run = save_run(tiny('sa'), tmp_path / 'run')
    path, first = lm_eval_tasks.default_results(fake_results([MC], run / 'ckpt.pt'), run / 'ckpt.pt')
    lm_eval_tasks.write_results(first, path)
    kept = path.read_bytes()
    save_run(tiny('sa', seed=1), run)  # retrained: other weights under the same name
    path2, new = lm_eval_tasks.default_results(fake_results([TEXT], run / 'ckpt.pt'), run / 'ckpt.pt')
    assert path2 != path and path2.parent == run and path2.name.startswith('lm_eval_results_')
    assert set(new['results']) == {TEXT} and path.read_bytes() == kept


def test_a_folders_results_go_beside_it_not_into_it(tmp_path):
    folder = tmp_path / 'export'
    folder.mkdir()
    (folder / 'config.json').write_text('{}')
    path, _ = lm_eval_tasks.default_results(fake_results([MC], folder), folder)
    assert path == tmp_path / f'export.{lm_eval_tasks.RESULTS}'
