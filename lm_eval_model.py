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

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import Collator, handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

import checkpoint
import devices
import tokenizer as tok
from errors import UserError


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
                 batch_size=16, max_gen_toks=256, unknown_chars='error', **unused):
        super().__init__()
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
            raise UserError(f"{e} (the task's text has them); --model_args unknown_chars=drop scores the text "
                            f"without them") from None

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


def note_truncated(lm, file=sys.stderr):
    """One line, if any context was longer than block_size."""
    if lm.truncated:
        print(f"note: {lm.truncated} request(s) longer than block_size={lm.block_size} tokens were cut from the "
              f"left (their context's start), as lm-eval's HF model does", file=file)
