"""
Every setting of train.py, sample.py and interactions.py, as data: its default, what it means
and the values it accepts. configurator.py takes the defaults from here, `--help` prints these tables, and
check() refuses a value outside its range with one line, before anything is written.
compare.py and the tests read the same tables. This is where a setting is documented: model.py's
GPTConfig names its fields (MODEL_ONLY: the three train.py does not take) and the README's flag
tables are markdown() of these (a test compares them). Defaults are nanoGPT's (GPT-2 124M on
OpenWebText), under nanoGPT's names, so a nanoGPT config file runs unchanged.

A range is written as it reads: '>= 1', '> 0', '[0, 1)' (0 included, 1 not), '-1 or >= 1';
'non-empty' refuses an empty string.
"""

import math
import re
from typing import NamedTuple

from nanohfa.errors import UserError


class Setting(NamedTuple):
    default: object
    help: str
    valid: str = ''  # the accepted range; '' accepts any value of the default's type


S = Setting
TRAIN = {
    'I/O': {
        'out_dir': S('out', "where ckpt.pt, log.jsonl, train_log.jsonl and run.json go", 'non-empty'),
        'overwrite': S(False, "True: a run from scratch may replace the checkpoint and logs already in out_dir"),
        'eval_interval': S(2000, "evaluate (and maybe save) every this many iterations", '>= 1'),
        'log_interval': S(1, "print the training loss every this many iterations", '>= 1'),
        'eval_iters': S(200, "batches per split in each evaluation", '>= 1'),
        'eval_only': S(False, "evaluate once and exit (writes nothing to out_dir)"),
        'always_save_checkpoint': S(True, "else only when val loss improves"),
        'init_from': S('scratch', "'scratch', 'resume' (out_dir/ckpt.pt), 'gpt2', 'gpt2-medium', 'gpt2-large', "
                                  "'gpt2-xl', a Hugging Face GPT-2 folder, or a checkpoint file or a folder export_hf.py "
                                  "wrote, to start from its weights"),
        'keep_last': S(0, "also keep the last k checkpoints as ckpt_<iter>.pt", '>= 0'),
    },
    'wandb logging (optional; works with WANDB_MODE=offline)': {
        'wandb_log': S(False, "log evaluations to Weights & Biases (imported only then)"),
        'wandb_project': S('owt', "wandb project"),
        'wandb_run_name': S('gpt2', "wandb run name; a resumed run continues the same wandb run"),
    },
    'data': {
        'dataset': S('openwebtext', "data/<dataset>/{train,val}.bin, or its shards (docs/data.md)"),
        'report_split': S(False, "True: evaluations read the selection half of the held-out documents; "
                                 "the end adds report_loss (every window of the report half)"),
        'data_dir': S('', "default: data/<dataset> beside train.py"),
        'gradient_accumulation_steps': S(5 * 8, "micro-steps per iteration, in total over all processes", '>= 1'),
        'batch_size': S(12, "per process and micro-step", '>= 1'),
        'block_size': S(1024, "context length in tokens", '>= 1'),
    },
    'model': {
        'n_layer': S(12, "transformer blocks", '>= 1'),
        'n_head': S(12, "attention heads per layer", '>= 1'),
        'n_embd': S(768, "embedding width", '>= 1'),
        'dropout': S(0.0, "dropout everywhere (0 for pretraining, 0.1+ for finetuning)", '[0, 1)'),
        'bias': S(False, "biases in Linear and LayerNorm layers (GPT-2 has them)"),
    },
    'attention': {
        'attention': S('sa', "the block of every layer: sa, linear, hfa_v1, hfa_v2 or ha; anything else fails "
                             "listing these"),
        'attn_layers': S('', "the variant of each layer instead, e.g. 'sa,sa,sa,ha' (as Roy et al. 2025 put a "
                             "2-simplicial layer every 4th)"),
        'head_dim': S(0, "head width; 0: n_embd // n_head ([IA] also allows n_embd // (n_head * hfa_order) for "
                         "HFA)", '>= 0'),
        'linear_norm': S(False, "linear: divide by the number of visible keys, i + 1 or the window (our choice, for "
                                "stability)"),
        'hfa_order': S(2, "A, the number of score factors HFA multiplies together; with A = 1, hfa_v1 is exactly sa",
                       '>= 1'),
        'n_hfa_head': S(-1, "-1: every head HFA; else that many HFA heads, the rest SA, in one layer ([IA]'s 2 SA "
                            "+ 2 HFA hybrid)", '-1 or >= 0'),
        'hfa_kron': S('auto', "HFA through SDPA on row-wise Kronecker-lifted queries/keys of width dh^A: on, off, or "
                              "auto (on while dh^A is small)"),
        'ha_order': S(3, "n, HA's order: n - 1 keys per score; order 3 runs by ha_form, order >= 4 on the "
                         "materialising reference", '>= 2'),
        'ha_share_kv': S(False, "HA with weight sharing, K2 = K1 and V2 = V1 ([IA] reports HA with and without)"),
        'ha_window1': S(0, "windowed HA: j1 in the last w1 positions (0: full causal); with ha_window2, O(T w1 w2) "
                           "(2-simplicial attention, Roy et al. 2025, arXiv 2507.02754)", '>= 0'),
        'ha_window2': S(0, "windowed HA: j2 in the last w2 positions (0: full causal)", '>= 0'),
        'ha_form': S('auto', "order-3 HA's PyTorch form: 'windowed' (each query's two windows gathered; both "
                             "windows set), 'blockwise' (online softmax over key blocks; any windows) or 'auto' "
                             "(windowed where it is faster, attention_kernels/ha/windowed.py)"),
        'attn_window': S(0, "sliding-window sa, linear and hfa heads: position i reads i - w < j <= i (0: full "
                            "causal), so locality can be matched with windowed HA (Beltagy et al. 2020, Longformer)",
                         '>= 0'),
        'kernel': S('auto', "who computes linear, hfa_* and ha: 'triton' (fused kernels, no T x T tensor), 'torch' "
                            "(PyTorch), 'auto' (Triton on CUDA when it imports, else PyTorch), 'reference' (every "
                            "variant, sa included, on its materialised definition: small sizes, for checks). "
                            "Attention-weight dropout, hfa_order > 4, softmax=False (HFA, linear HA), ha_order >= 4 "
                            "and float64 always use PyTorch; sa is otherwise always SDPA"),
        'kernel_check': S(True, "check each Triton kernel's first use on CUDA against PyTorch; a mismatch prints "
                                "one line and (auto) uses PyTorch there, (triton) stops"),
    },
    'adamw optimizer': {
        'learning_rate': S(6e-4, "peak learning rate", '> 0'),
        'max_iters': S(600000, "total training iterations", '>= 0'),
        'weight_decay': S(1e-1, "AdamW weight decay, on 2-D weights only", '>= 0'),
        'beta1': S(0.9, "AdamW beta1", '[0, 1)'),
        'beta2': S(0.95, "AdamW beta2", '[0, 1)'),
        'grad_clip': S(1.0, "clip the gradient norm to this (0 disables clipping)", '>= 0'),
    },
    'learning rate decay: linear warmup, then cosine down to min_lr': {
        'decay_lr': S(True, "False: constant learning_rate"),
        'warmup_iters': S(2000, "linear warmup iterations", '>= 0'),
        'lr_decay_iters': S(600000, "cosine decay ends here (~ max_iters, per Chinchilla)", '>= 0'),
        'min_lr': S(6e-5, "learning rate after the decay (~ learning_rate / 10)", '>= 0'),
    },
    'DDP / FSDP (under torchrun)': {
        'parallel': S('ddp', "'ddp': every process holds the whole model, gradients and AdamW state; 'fsdp': "
                             "FSDP2, all three sharded over the processes (for models past one GPU's memory)"),
        'ddp_backend': S('nccl', "torch.distributed's backend on CUDA (nanoGPT calls it `backend`); on CPU gloo "
                                "is used whatever this says"),
        'ddp_timeout': S(600, "seconds a collective may wait for a dead peer", '>= 1'),
    },
    'system': {
        'device': S('auto', "'auto' (cuda > mps > cpu), 'cpu', 'cuda', 'cuda:1', 'mps'"),
        'dtype': S('auto', "'auto' (bfloat16 on CUDA where supported, else float32), 'float32', 'bfloat16', 'float16'"),
        'compile': S(False, "torch.compile the model"),
        'activation_checkpointing': S(False, "keep only each block's input and recompute its activations in the "
                                             "backward: less memory for about a third more compute"),
        'seed': S(1337, "seeds model init, data order and dropout"),
        'skip_nonfinite': S(False, "skip (and count) steps with a NaN/inf loss or gradient (a sync per step)"),
        'peak_flops': S(0.0, "MFU denominator, FLOP/s per device; 0: hardware.py (CUDA table, else measured "
                             "with the run's threads and cached)", '>= 0'),
        'threads': S(0, "CPU threads per process (0: torch's default, a thread per core; DDP on CPU: the "
                        "cores shared out)", '>= 0'),
        'kernel_preflight_timeout': S(120.0, "seconds for the preflight, after its imports: on CUDA, before training, "
                                             "each Triton kernel the run uses runs first in a child process; a crash, "
                                             "a hang past this or a mismatch sends its family to PyTorch, cached (off "
                                             "with the self-check; docs/reliability.md). Under torchrun both "
                                             "preflight timeouts + 30 s must fit in ddp_timeout", '> 0'),
        'preflight_import_timeout': S(120.0, "seconds each preflight child may take to import torch and triton "
                                             "(a cold network file system): past it the family uses PyTorch for this "
                                             "run, not cached: the next run checks again", '> 0'),
    },
}

SAMPLE = {
    '': {
        'init_from': S('resume', "'resume' (out_dir/ckpt.pt), 'gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl', "
                                 "a Hugging Face GPT-2 folder, a checkpoint file or a folder export_hf.py wrote"),
        'out_dir': S('out', "the training run whose ckpt.pt to sample from", 'non-empty'),
        'meta': S('', "the tokenizer of a checkpoint that carries none (nanoGPT's): its dataset folder or "
                      "meta.pkl; default: data/<its dataset>"),
        'start': S('\n', "prompt text, or FILE:path to read it from a file"),
        'num_samples': S(1, "samples to draw", '>= 1'),
        'max_new_tokens': S(500, "tokens generated per sample", '>= 1'),
        'temperature': S(0.8, "< 1 sharpens, > 1 flattens the distribution; 0: greedy (the most likely token)", '>= 0'),
        'top_k': S(200, "keep only the k most likely tokens (0: all)", '>= 0'),
        'seed': S(1337, "the same seed gives the same text"),
        'device': S('auto', "'auto' (cuda > mps > cpu), 'cpu', 'cuda', 'cuda:1', 'mps'"),
        'dtype': S('float32', "'float32', 'bfloat16', 'float16' (autocast), or 'auto' (bfloat16 on CUDA where "
                              "supported, nanoGPT's choice)"),
        'compile': S(False, "accepted for nanoGPT's command lines; sampling runs eagerly (as in nanoGPT, where "
                            "the compiled module does not reach generate)"),
        'use_cache': S(True, "keep keys and values between steps (False: recompute the context)"),
    },
}


# model.GPTConfig's fields that train.py does not take: GPT-2's weights set gelu, the experiments the others
MODEL_ONLY = {
    '': {
        'gelu': S('exact', "'tanh': the tanh approximation, as GPT-2's weights were trained with"),
        'softmax': S(True, "False drops the softmax of every variant: sa heads become linear, hfa_* and ha their "
                           "linear forms (the experiments)"),
        'causal': S(True, "False only for the set-to-set experiments (windows need causal=True: with False they "
                          "are refused)"),
    },
}


INTERACTIONS = {
    '': {
        'out_dir': S('out', "the training run whose ckpt.pt to read; several (a,b,c or a glob: seeds of one "
                            "variant) to match heads across them and report what recurs", 'non-empty'),
        'meta': S('', "the tokenizer of a checkpoint that carries none (nanoGPT's): its dataset folder or "
                      "meta.pkl, checked against its vocabulary as in sample.py; default: data/<its dataset>"),
        'init_from': S('resume', "'resume' (out_dir/ckpt.pt), 'gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl' or a "
                                 "Hugging Face GPT-2 folder"),
        'layer': S(0, "which layer's heads to read; only the first is exact in the token basis (later ones: the "
                      "embedding's direct path)", '>= 0'),
        'positions': S('mean', "'mean': token vectors x(a) = mean_p LN(wte[a] + wpe[p]), so every coefficient is "
                               "exactly the score averaged over independent query and key positions; 'none': no "
                               "position embedding; or a position, e.g. '5'"),
        'ln': S(True, "apply the layer's LayerNorm (ln_1) to the token vectors, as the layer does (False: the raw "
                      "embedding, [IA]'s setting)"),
        'data_dir': S('', "prepared data whose train.bin gives token counts (needed for GPT-2); default: data/<the "
                          "checkpoint's dataset>"),
        'top_n': S(0, "read the top_n most frequent tokens; 0: all of them up to 256 (pairs), 96 (HA triples)"),
        'min_freq': S(3e-4, "leave out tokens rarer than this in the training data (their embeddings are barely "
                            "trained)", '[0, 1]'),
        'top_k': S(20, "pairs / triples listed per head"),
        'freq_tokens': S(100_000_000, "count token frequencies over the first this many training tokens (0: all)",
                         '>= 0'),
        'report_dir': S('', "where to write; default: out_dir/interactions (GPT-2: interactions-<name>)"),
        'figures': S(True, "write the heatmaps"),
    },
}


def flat(table):
    """{key: Setting} over every section."""
    return {k: s for section in table.values() for k, s in section.items()}


def markdown(table):
    """The table as the README shows it: a row per key with its default and meaning (and range)."""
    rows = ['| flag | default | meaning |', '|---|---|---|']
    for key, s in flat(table).items():
        valid = f" ({s.valid})" if s.valid else ''
        meaning = re.sub(r'([|]|<(?=\w))', r'\\\1', s.help + valid)  # escaped: | ends a cell, <x opens a tag
        rows.append(f"| `{key}` | `{s.default!r}` | {meaning} |")
    return '\n'.join(rows)


def defaults(table):
    return {k: s.default for k, s in flat(table).items()}


def _inside(value, rule):
    """Whether value satisfies a range rule: '>= 1', '> 0', '[0, 1)', '-1', or 'a or b'."""
    if ' or ' in rule:
        return any(_inside(value, r) for r in rule.split(' or '))
    if rule[0] in '[(':
        lo, hi = (float(x) for x in rule[1:-1].split(','))
        return (lo <= value if rule[0] == '[' else lo < value) and (value <= hi if rule[-1] == ']' else value < hi)
    if ' ' not in rule:
        return value == float(rule)
    op, number = rule.split()
    return value >= float(number) if op == '>=' else value > float(number)


def check(table, config):
    """Refuse the first value outside its range: one line saying which key, the value and the range."""
    for key, s in flat(table).items():
        value = config.get(key)
        if s.valid == 'non-empty':  # an empty out_dir would write into the current folder
            if isinstance(value, str) and not value.strip():
                raise UserError(f"{key}={value!r} is empty; {key} must name a folder ({s.help}), e.g. --{key}=out-mine")
            continue
        if not s.valid or not isinstance(value, (int, float)):
            continue
        if not (math.isfinite(value) and _inside(value, s.valid)):
            rule = f"in {s.valid}" if s.valid[0] in '[(' else s.valid
            raise UserError(f"{key}={value!r} is out of range; {key} must be {rule} ({s.help})")


def notes(config, device):
    """Settings that are valid but likely not what was meant, each as a one-line note (train.py
    prints them and runs on)."""
    c, found = config, []
    if c['kernel'] == 'triton' and not device.startswith('cuda'):
        found.append(f"note: kernel='triton' on {device} runs Triton's interpreter, for testing the kernels: expect "
                     f"it hundreds of times slower than kernel='torch'")
    if c['eval_only'] or not c['decay_lr']:
        return found
    if c['max_iters'] < c['warmup_iters']:
        found.append(f"note: max_iters={c['max_iters']} is below warmup_iters={c['warmup_iters']}: the run ends while "
                     f"the learning rate still warms up (it never reaches learning_rate={c['learning_rate']:g}); lower "
                     f"--warmup_iters")
    if c['lr_decay_iters'] != c['max_iters']:
        found.append(f"note: lr_decay_iters={c['lr_decay_iters']} differs from max_iters={c['max_iters']}: the cosine "
                     f"reaches min_lr={c['min_lr']:g} at iteration {c['lr_decay_iters']}, not at the end of the run "
                     f"(nanoGPT sets them equal)")
    return found


def attention_text(cfg):
    """The attention of a model (its GPTConfig) as train.py's banner shows it: per layer in
    order, and mixed heads as what they are."""
    kinds = cfg.layer_attentions()
    text = cfg.attention if len(set(kinds)) == 1 else f"per layer {','.join(kinds)}"
    if any(k.startswith('hfa') for k in kinds) and 0 <= cfg.n_hfa_head < cfg.n_head:
        text += f" ({cfg.n_hfa_head} HFA + {cfg.n_head - cfg.n_hfa_head} SA heads)"
    return text
