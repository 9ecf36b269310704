"""
Bad inputs to train.py, sample.py and prepare_openwebtext.py: each row of the table is one
test. Each must give exactly one line on stderr starting with `error:` (holding the
expected text), a non-zero exit, no traceback, and leave every existing file (data,
checkpoint, logs) byte-for-byte as it was. One row is a value that must be accepted.

Every row runs in its own copy of a small workspace (a character dataset and a checkpoint
trained by train.py). A row whose out_dir is {w}/fresh must not create it: every value is
checked before anything is written. The rows are started together, a few at a time, because each
subprocess spends seconds importing torch on a loaded machine. The table with the messages
is in docs/reliability.md.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.slow  # subprocesses: make test, not make test-fast
ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
ITOS = list("abcdefghijklmnop")
TINY = ['--n_layer=1', '--n_head=2', '--n_embd=32', '--block_size=16', '--batch_size=4',
        '--gradient_accumulation_steps=1', '--device=cpu', '--eval_iters=2', '--eval_interval=2',
        '--warmup_iters=0', '--log_interval=1000']
SAMPLE = ['--device=cpu', '--max_new_tokens=2', '--num_samples=1']
NANOGPT_CKPT = ROOT / 'tests' / 'fixtures' / 'nanogpt_ckpt.pt'  # 16 tokens, its config's dataset 'shakespeare_char'


def make_data(folder, itos=ITOS, n_train=2000, n_val=400):
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rng.integers(0, len(itos), n_train).astype(np.uint16).tofile(folder / 'train.bin')
    rng.integers(0, len(itos), n_val).astype(np.uint16).tofile(folder / 'val.bin')
    (folder / 'meta.json').write_text(json.dumps({'tokenizer': 'char', 'vocab_size': len(itos), 'itos': itos}))


def setup_workspace(w):
    """Extra inputs some rows need, beside the dataset w/data and the checkpoint w/out."""
    (w / 'bad_config.py').write_text("n_layer = = 2\n")
    (w / 'empty.txt').write_text('')
    (w / 'one.txt').write_text("A single paragraph of text, with no blank line in it, is one document.\n")
    make_data(w / 'data20', itos=list("abcdefghijklmnopqrst"))       # another vocabulary size
    make_data(w / 'data16b', itos=list("ABCDEFGHIJKLMNOP"))           # same size, other characters
    (w / 'afile').write_text('a file, not a folder')
    (w / 'scriptds').mkdir()  # a dataset that is a loading script, which datasets >= 4 refuses to run
    (w / 'scriptds' / 'scriptds.py').write_text("import datasets\n\n\nclass Scriptds(datasets.GeneratorBasedBuilder):\n    pass\n")
    for name in ('data_odd', 'data_empty', 'data_badmeta', 'data_bigid'):
        make_data(w / name)
    train = w / 'data_odd' / 'train.bin'
    train.write_bytes(train.read_bytes()[:-1])                        # one byte short
    (w / 'data_empty' / 'train.bin').write_bytes(b'')
    (w / 'data_badmeta' / 'meta.json').write_text('{"tokenizer": "char", "vocab_size": 16,')  # cut short
    ids = np.fromfile(w / 'data_bigid' / 'val.bin', dtype=np.uint16)
    ids[7] = 20                                                       # beyond the 16-token vocabulary
    ids.tofile(w / 'data_bigid' / 'val.bin')
    make_data(w / 'shakespeare_char')                                 # the embedded corpus's character folder
    (w / 'cfg.yaml').write_text("n_layer: 2\nmax_iters: 2\n")
    (w / 'annotated.py').write_text("n_layer: 2\n")                   # YAML's syntax, valid Python that sets nothing
    nano = torch.load(NANOGPT_CKPT, weights_only=True)
    nano['config']['dataset'] = str(w / 'data20')                     # its dataset here has another vocabulary
    torch.save(nano, w / 'nano_ckpt.pt')
    ckpt = torch.load(w / 'out' / 'ckpt.pt', weights_only=True)
    ckpt['model']['transformer.wte.weight'] = ckpt['model']['transformer.wte.weight'][:, :31].clone()
    torch.save(ckpt, w / 'badshape.pt')                                # one tensor of the wrong shape
    ckpt = torch.load(w / 'out' / 'ckpt.pt', weights_only=True)
    ckpt['model_args']['n_layer'] = 10 ** 6
    torch.save(ckpt, w / 'million_layers.pt')                         # a million layers claimed over one
    make_data(w / 'data_shortitos')
    (w / 'data_shortitos' / 'meta.json').write_text(json.dumps({'tokenizer': 'char', 'vocab_size': 16, 'itos': ITOS[:15]}))
    make_data(w / 'data_hugevocab')
    (w / 'data_hugevocab' / 'meta.json').write_text(json.dumps({'tokenizer': 'tiktoken', 'vocab_size': 10 ** 9}))
    (w / 'cmp.py').write_text("n_layer = 1\nn_head = 2\nn_embd = 16\nblock_size = 16\nbatch_size = 2\n"
                              "gradient_accumulation_steps = 1\nmax_iters = 2\ndevice = 'cpu'\n")


# id: (script, arguments, text the error line must hold; None: must succeed[, environment]),
# {data}/{out}/{w} are the row's workspace paths; in the environment None removes a variable
OFFLINE_PROBE = {'HF_ENDPOINT': 'http://127.0.0.1:9', 'HF_HUB_OFFLINE': None, 'HF_DATASETS_OFFLINE': None,
                 'TRANSFORMERS_OFFLINE': None,  # nothing listens on port 9: the Hub probe fails at once
                 **{v: None for v in ('HTTPS_PROXY', 'https_proxy', 'ALL_PROXY', 'all_proxy')}}
ROWS = {
    'unknown_attention': ('train.py', ['--attention=flash9'], "unknown attention 'flash9'; valid: "),
    'unknown_config_key': ('train.py', ['--n_layers=2'], "unknown config key 'n_layers'; did you mean n_layer"),
    'wrong_type': ('train.py', ['--max_iters=lots'], "max_iters expects int (default 600000), got 'lots'"),
    'missing_config_file': ('train.py', ['{w}/no_such_config.py'], "config file '{w}/no_such_config.py' not found"),
    'malformed_config_file': ('train.py', ['{w}/bad_config.py'], "config file {w}/bad_config.py failed: SyntaxError"),
    'missing_dataset': ('train.py', ['--data_dir={w}/nodata'],
                        "{w}/nodata/train.bin not found; prepare the data first: `python prepare_openwebtext.py --source=... "
                        "--name=nodata`"),
    'empty_corpus': ('prepare_openwebtext.py', ['--source={w}/empty.txt', '--tokenizer=char', '--name=_reltest_empty',
                                                '--root={w}/prepared'],
                     "holds no text; give a non-empty corpus"),
    'one_paragraph_corpus': ('prepare_openwebtext.py', ['--source={w}/one.txt', '--tokenizer=char', '--name=_reltest_one',
                                                        '--root={w}/prepared'],
                             "the corpus has a single document, too few for a train/val split"),
    'block_size_larger_than_data': ('train.py', ['--block_size=5000'],
                                    "train.bin has 2000 tokens, not enough for block_size=5000"),
    'resume_other_vocab_size': ('train.py', ['--init_from=resume', '--data_dir={w}/data20'],
                                "was trained with tokenizer 'char' (vocab 16) but {w}/data20 uses 'char' (vocab 20)"),
    'resume_other_characters': ('train.py', ['--init_from=resume', '--data_dir={w}/data16b'],
                                "was trained with tokenizer 'char' (vocab 16) but {w}/data16b uses 'char' (vocab 16, other characters)"),
    'truncated_checkpoint_resume': ('train.py', ['--init_from=resume'], "ckpt.pt is unreadable or truncated"),
    'truncated_checkpoint_sample': ('sample.py', ['--out_dir={out}', *SAMPLE], "ckpt.pt is unreadable or truncated"),
    'out_dir_not_writable': ('train.py', ['--out_dir={w}/afile/run'], "out_dir '{w}/afile/run' cannot be written"),
    'prompt_outside_char_vocab': ('sample.py', ['--out_dir={out}', '--start=xyz!', *SAMPLE],
                                  "characters '!xyz' are not in this model's character vocabulary of 16"),
    'value_containing_equals': ('train.py', ['--wandb_run_name=a=b', '--eval_only=True', '--out_dir={w}/new_out'], None),
    'dtype_name': ('train.py', ['--dtype=bf16'], "dtype='bf16' is not a dtype name; valid: auto, float32, bfloat16, float16"),
    'device_name': ('train.py', ['--device=gpu'], "device='gpu' is not a device name; valid: auto, cpu, cuda, cuda:N, mps"),
    'device_mps_absent': ('train.py', ['--device=mps'], "device='mps' but MPS (Apple GPU) is not available here"),
    'sample_device_cuda_absent': ('sample.py', ['--out_dir={out}', *SAMPLE, '--device=cuda'],
                                  "device='cuda' but CUDA is not available here; use --device=cpu"),
    'resume_contradicts_architecture': ('train.py', ['--init_from=resume', '--n_layer=4'],
                                        "n_layer=4 (set by --n_layer=4) contradicts the checkpoint {w}/out/ckpt.pt, "
                                        "which has n_layer=1; its architecture is fixed"),
    'init_from_unknown': ('train.py', ['--init_from=gpt3'], "init_from must be 'scratch', 'resume', one of gpt2, "
                          "gpt2-medium, gpt2-large, gpt2-xl or a folder holding a Hugging Face GPT-2"),
    'gpt2_weights_other_attention': ('train.py', ['--init_from=gpt2', '--attention=hfa_v1'],
                                     "init_from='gpt2' loads GPT-2's softmax attention weights; attention must be 'sa'"),
    'sample_init_from_unknown': ('sample.py', ['--init_from=scratch', *SAMPLE], "init_from must be 'resume', one of gpt2"),
    'prepare_loading_script': ('prepare_openwebtext.py', ['--hf_id={w}/scriptds', '--name=_reltest_script', '--root={w}/prepared'],
                               "it is a loading script, which datasets >= 4 no longer runs; use the Hub's parquet "
                               "conversion, --hf_revision=refs/convert/parquet"),
    'prepare_offline': ('prepare_openwebtext.py', ['--name=_reltest_owt', '--root={w}/prepared'],
                        "the Hugging Face Hub cannot be reached from here (offline) and the dataset is not in its "
                        "cache; prepare a local source instead: --source=path/to/file.txt", OFFLINE_PROBE),
}
FRESH = ['--out_dir={w}/fresh']  # rows that must not create their out_dir
CMP = ['--config', '{w}/cmp.py', '--data_dir={data}', '--out', '{w}/fresh']
ROWS.update({
    # every value range-checked before anything is written
    **{f'range_{k}_{v}'.replace('-', 'minus').replace('.', '_'): ('train.py', [f'--{k}={v}', *FRESH],
                                                                  f"{k}={v} is out of range; {k} must be {rule}")
       for k, v, rule in [('batch_size', 0, '>= 1'), ('block_size', 0, '>= 1'), ('n_head', 0, '>= 1'),
                          ('eval_interval', 0, '>= 1'), ('log_interval', 0, '>= 1'), ('eval_iters', 0, '>= 1'),
                          ('learning_rate', -1.0, '> 0'), ('dropout', 1.5, 'in [0, 1)'), ('n_layer', -1, '>= 1'),
                          ('n_embd', 0, '>= 1'), ('beta2', 1.0, 'in [0, 1)'), ('max_iters', -5, '>= 0')]},
    'overwrite_wrong_type': ('train.py', ['--overwrite=yes', *FRESH], "overwrite expects bool (default False), got 'yes'"),
    'decay_ends_where_warmup_ends': ('train.py', ['--warmup_iters=2', '--lr_decay_iters=2', '--max_iters=4', *FRESH], None),
    # an out_dir belongs to one run
    'scratch_over_a_checkpoint': ('train.py', [], "out_dir '{w}/out' already holds a run (ckpt.pt saved "),
    'resume_past_max_iters': ('train.py', ['--init_from=resume', '--max_iters=1'],
                              "the checkpoint {w}/out/ckpt.pt is at iteration 2, past max_iters=1: nothing to train"),
    # data files checked when opened
    'train_bin_odd_length': ('train.py', ['--data_dir={w}/data_odd', *FRESH],
                             "{w}/data_odd/train.bin holds 3,999 bytes, an odd number: not a file of uint16 tokens"),
    'train_bin_empty': ('train.py', ['--data_dir={w}/data_empty', *FRESH],
                        "{w}/data_empty/train.bin holds 0 bytes, nothing: not a file of uint16 tokens"),
    'meta_json_corrupt': ('train.py', ['--data_dir={w}/data_badmeta', *FRESH],
                          "{w}/data_badmeta/meta.json cannot be read (Expecting property name enclosed in double quotes)"),
    'token_beyond_vocabulary': ('train.py', ['--data_dir={w}/data_bigid', *FRESH],
                                "{w}/data_bigid holds token id 20 but its vocabulary has 16 tokens"),
    # a corrupt checkpoint is not called unsafe
    'random_bytes_checkpoint_resume': ('train.py', ['--init_from=resume'], "ckpt.pt is unreadable or truncated"),
    'random_bytes_checkpoint_sample': ('sample.py', ['--out_dir={out}', *SAMPLE], "ckpt.pt is unreadable or truncated"),
    # sample.py: ranges, and nanoGPT's keys accepted
    'sample_temperature_negative': ('sample.py', ['--out_dir={out}', *SAMPLE, '--temperature=-1.0'],
                                    "temperature=-1.0 is out of range; temperature must be >= 0"),
    'sample_top_k_negative': ('sample.py', ['--out_dir={out}', *SAMPLE, '--top_k=-1'], "top_k=-1 is out of range"),
    'sample_num_samples_zero': ('sample.py', ['--out_dir={out}', *SAMPLE, '--num_samples=0'],
                                "num_samples=0 is out of range"),
    'sample_nanogpt_keys': ('sample.py', ['--out_dir={out}', *SAMPLE, '--start=abc', '--dtype=bfloat16',
                                             '--compile=False'], None),
    # eval_only writes nothing, so an out_dir that cannot be written is no obstacle
    'eval_only_unwritable_out_dir': ('train.py', ['--eval_only=True', '--out_dir={w}/afile/run'], None),
    # compare.py: one line too
    'compare_unknown_variant': ('compare.py', [*CMP, '--variants', 'sa,hfaa'], "unknown variant(s) hfaa; presets: sa,"),
    # a name is one folder inside --out (or --root): none escapes, none shares another's folder
    'compare_variant_escapes': ('compare.py', [*CMP, '--variants', '../../x', '--preset', '../../x', 'attention=sa'],
                                "variant '../../x' is not a folder name: give one path component"),
    'compare_variant_trailing_slash': ('compare.py', [*CMP, '--variants', 'sa/'], "variant 'sa/' is not a folder name"),
    'compare_variant_twice': ('compare.py', [*CMP, '--variants', 'sa,hfa,sa'],
                              "--variants names one run folder twice (sa and sa): give each variant once"),
    'compare_variants_differ_by_case': ('compare.py', [*CMP, '--variants', 'sa,SA', '--preset', 'SA', 'attention=sa'],
                                        "--variants names one run folder twice (sa and SA)"),
    'prepare_name_escapes': ('prepare_openwebtext.py', ['--source={w}/one.txt', '--tokenizer=char', '--name=../../x',
                                                        '--root={w}/prepared'],
                             "dataset name (--name) '../../x' is not a folder name"),
    'compare_missing_out': ('compare.py', ['--variants', 'sa'], "the following arguments are required: --out"),
    'prepare_bad_choice': ('prepare_openwebtext.py', ['--tokenizer=bpe', '--root={w}/prepared'],
                           "argument --tokenizer: invalid choice: 'bpe' (choose from 'gpt2', 'char')"),
    'compare_preset_seeds_zero': ('compare.py', [*CMP, '--variants', 'sa', '--preset', 'sa', 'seeds=0'],
                                  "--preset sa: seeds=0 is a count of no seeds (a count N runs seeds 0..N-1); for seed 0 "
                                  "alone give the count seeds=1 or the list seeds=0, or seeds=[0]"),
    'compare_unbuildable_preset': ('compare.py', [*CMP, '--variants', 'bad', '--preset', 'bad', 'n_head=3'],
                                   "variant bad cannot be built (n_embd=16 is not divisible by n_head=3"),
    # a checkpoint's vocabulary against the meta sample.py would decode it with
    'sample_nanogpt_meta_other_vocab': ('sample.py', [f'--init_from={NANOGPT_CKPT}', '--meta={w}/data20', *SAMPLE],
                                        f"checkpoint {NANOGPT_CKPT} has a vocabulary of 16 tokens but {{w}}/data20 has "
                                        f"20 characters: not the data it was trained on; give that data's meta: "
                                        f"--meta=path/to/shakespeare_char (the dataset folder) or --meta=path/to/meta.pkl"),
    'sample_nanogpt_dataset_other_vocab': ('sample.py', ['--init_from={w}/nano_ckpt.pt', *SAMPLE],
                                           "data20/meta.json has 20 characters: not the data it was trained on; give "
                                           "that data's meta: --meta=path/to/data20"),
    'sample_meta_other_characters': ('sample.py', ['--out_dir={out}', '--meta={w}/data16b', *SAMPLE],
                                     "checkpoint {w}/out/ckpt.pt has a vocabulary of 16 tokens but {w}/data16b has "
                                     "other characters than the 16 it was trained on"),
    'sample_meta_missing': ('sample.py', ['--out_dir={out}', '--meta={w}/nowhere', *SAMPLE],
                            "--meta={w}/nowhere not found; give the folder of the dataset"),
    # one-liners
    'empty_out_dir': ('train.py', ['--out_dir='], "out_dir='' is empty; out_dir must name a folder"),
    'sample_empty_out_dir': ('sample.py', ['--out_dir=', *SAMPLE], "out_dir='' is empty; out_dir must name a folder"),
    'init_from_missing_file': ('train.py', ['--init_from={w}/no_such.pt', *FRESH],
                               "init_from '{w}/no_such.pt': file not found; give the path of a checkpoint file"),
    'sample_init_from_missing_file': ('sample.py', ['--init_from={w}/out/no_such.pt', *SAMPLE],
                                      "init_from '{w}/out/no_such.pt': file not found"),
    'gpt2_weights_on_char_data': ('train.py', ['--init_from=gpt2', '--data_dir={w}/shakespeare_char', *FRESH],
                                  "needs GPT-2 tokens, but {w}/shakespeare_char was prepared with the 'char' tokenizer; "
                                  "prepare GPT-2 tokens: python prepare_shakespeare.py --only=gpt2 and train with "
                                  "--dataset=shakespeare"),
    'yaml_config_file': ('train.py', ['{w}/cfg.yaml', *FRESH], "config file {w}/cfg.yaml is not a Python file (.py)"),
    'annotation_config_file': ('train.py', ['{w}/annotated.py', *FRESH],
                               "config file {w}/annotated.py line 1: 'n_layer: 2' assigns nothing (a type annotation); "
                               "write n_layer = 2"),
    # FSDP: a choice among two, and only under torchrun
    # checked before the out_dir is claimed (an existing run is not moved aside), the model built or the data read
    'init_from_wrong_shape_overwrite': ('train.py', ['--init_from={w}/badshape.pt', '--overwrite=True'],
                                        "{w}/badshape.pt holds transformer.wte.weight of shape (16, 31) where its "
                                        "model arguments give (16, 32); the file is damaged or not one model's"),
    'init_from_million_layers': ('train.py', ['--init_from={w}/million_layers.pt', '--n_layer=1000000', *FRESH],
                                 "{w}/million_layers.pt holds weights for 1 layer but its model arguments say "
                                 "n_layer=1000000"),
    'meta_itos_shorter_than_vocab': ('train.py', ['--data_dir={w}/data_shortitos', *FRESH],
                                     "{w}/data_shortitos/meta.json lists 15 characters for vocab_size=16"),
    'meta_vocab_implausible': ('train.py', ['--data_dir={w}/data_hugevocab', *FRESH],
                               "{w}/data_hugevocab/meta.json says vocab_size=1000000000, which no tokenizer has"),
    'parallel_unknown': ('train.py', ['--parallel=zero3', *FRESH], "parallel='zero3' is not a choice; valid: ddp, fsdp"),
    'fsdp_without_torchrun': ('train.py', ['--parallel=fsdp', *FRESH],
                              "parallel='fsdp' shards the model over processes started by torchrun"),
})
IN_WORKSPACE = {'empty_out_dir', 'sample_empty_out_dir'}  # run from their workspace: a run into '' writes there
if torch.backends.mps.is_available():  # these rows need a machine without the device
    del ROWS['device_mps_absent']
if torch.cuda.is_available():
    del ROWS['sample_device_cuda_absent']


def command(row, w):
    script, args = ROWS[row][:2]
    fill = lambda s: s.format(w=w, data=w / 'data', out=w / 'out')
    args = [fill(a) for a in args]
    if script == 'train.py':  # defaults first: a row's own --data_dir/--out_dir comes later and wins
        args = [*TINY, f'--data_dir={w / "data"}', f'--out_dir={w / "out"}', *args]
    return [PY, str(ROOT / script), *args]


def snapshot(folder):
    return {p: p.read_bytes() for p in sorted(Path(folder).rglob('*')) if p.is_file()}


@pytest.fixture(scope='module')
def results(tmp_path_factory):
    base = tmp_path_factory.mktemp('bad')
    make_data(base / 'data')
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1'}
    env.pop('NANOHFA_TEST_DIE_AT', None)
    r = subprocess.run([PY, 'train.py', *TINY, f'--data_dir={base / "data"}', f'--out_dir={base / "out"}',
                        '--max_iters=2'], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and (base / 'out' / 'ckpt.pt').exists(), r.stdout + r.stderr
    setup_workspace(base)
    work, before, procs, res = {}, {}, {}, {}
    for row in ROWS:
        w = work[row] = base.parent / f'{base.name}_{row}'
        shutil.copytree(base, w)
        if row.startswith('truncated_checkpoint'):
            ckpt = w / 'out' / 'ckpt.pt'
            ckpt.write_bytes(ckpt.read_bytes()[:ckpt.stat().st_size // 2])
        if row.startswith('random_bytes_checkpoint'):
            (w / 'out' / 'ckpt.pt').write_bytes(np.random.default_rng(1).bytes(5000))
        before[row] = snapshot(w)
    pending, t0 = list(ROWS), time.time()
    while pending or procs:
        while pending and len(procs) < 6:
            row = pending.pop(0)
            extra = ROWS[row][3] if len(ROWS[row]) > 3 else {}
            row_env = {k: v for k, v in {**env, **extra}.items() if v is not None}
            procs[row] = subprocess.Popen(command(row, work[row]), cwd=work[row] if row in IN_WORKSPACE else ROOT,
                                          env=row_env, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for row, p in list(procs.items()):
            if p.poll() is not None or time.time() - t0 > 600:
                out, err = p.communicate(timeout=60)
                res[row] = {'rc': p.returncode, 'stdout': out, 'stderr': err, 'w': work[row],
                            'before': before[row], 'after': snapshot(work[row])}
                del procs[row]
        time.sleep(0.05)
    return res


@pytest.mark.parametrize('row', list(ROWS))
def test_bad_input(results, row):
    r = results[row]
    w, expected = r['w'], ROWS[row][2]
    info = f"rc={r['rc']}\nstderr:\n{r['stderr']}\nstdout:\n{r['stdout'][-2000:]}"
    assert 'Traceback' not in r['stderr'], info
    for path, data in r['before'].items():  # nothing overwritten or removed
        assert r['after'].get(path) == data, f"{path} changed\n{info}"
    if expected is None:  # accepted
        assert r['rc'] == 0 and not r['stderr'].strip(), info
        return
    assert r['rc'] != 0, info
    lines = [l for l in r['stderr'].splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith('error: '), info
    assert expected.format(w=w) in lines[0], info
    assert 'could run code' not in lines[0] or 'system' in lines[0], info  # corrupt is not unsafe
    if '--out_dir={w}/fresh' in ROWS[row][1] or '{w}/fresh' in ROWS[row][1]:
        assert not (w / 'fresh').exists(), f"the refused run created its out_dir\n{info}"
    assert set(r['after']) == set(r['before']), f"the refused run wrote files\n{info}"


def test_value_containing_equals_is_kept_whole(results):
    assert "Overriding: wandb_run_name = 'a=b'" in results['value_containing_equals']['stdout'].splitlines()


def test_prepare_offline_fails_at_once(results):
    """Offline, the Hub is not retried (it used to print 16 lines of retries over ~24 s first)."""
    r = results['prepare_offline']
    assert 'Retrying' not in r['stderr'] and 'Retry' not in r['stdout']


@pytest.mark.parametrize('row', ['empty_corpus', 'one_paragraph_corpus', 'prepare_loading_script', 'prepare_offline',
                                 'prepare_name_escapes'])
def test_failed_prepare_writes_nothing(results, row):
    assert not (results[row]['w'] / 'prepared').exists()


@pytest.mark.parametrize('name, fix', [
    ('fineweb10B', "fetch FineWeb's GPT-2 shards with modded-nanogpt's data/cached_fineweb10B.py"),
    ('openwebtext', '`python prepare_openwebtext.py`, OpenWebText from the Hub'),
    ('shakespeare_char', '`python prepare_shakespeare.py`;'),
    ('milton', '`python prepare_shakespeare.py --corpus=milton`'),
    ('mine', '`python prepare_openwebtext.py --source=... --name=mine`')])
def test_missing_data_names_the_command_that_makes_it(name, fix, tmp_path):
    """config/fineweb10B_sa.py's data comes as llm.c's shards, config/hfa.py's from a plain
    prepare_openwebtext.py: the line says so, not another dataset's recipe."""
    from nanohfa import data
    from nanohfa.errors import UserError
    with pytest.raises(UserError) as e:
        data.split_tokens(tmp_path / name, 'train', 8)
    assert str(e.value).startswith(f"{tmp_path / name}/train.bin not found; prepare the data first: {fix}")
