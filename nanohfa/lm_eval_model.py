"""
Our checkpoints as an lm-evaluation-harness model: any attention variant, any kernel (the Triton
ones included), straight from a checkpoint. (lm-eval's own `hf` model runs the same models
through a folder written by export_hf.py, on their PyTorch forms: docs/huggingface.md.)

    import lm_eval, lm_eval_model          # importing registers the model as 'nanohfa'
    lm_eval.simple_evaluate(model='nanohfa', model_args='path=out-x', tasks=['wikitext'])

`path` is an out_dir (its ckpt.pt), a checkpoint file (ours, nanoGPT's, an FSDP run's), or what
init_from accepts (GPT-2's weights: a name in the Hugging Face cache, or a folder written by
save_pretrained; a folder written by export_hf.py). The tokenizer is the checkpoint's own (its character table, or GPT-2's BPE
through tiktoken); `meta=` reads a nanoGPT checkpoint's, as sample.py's --meta.

How each request type is computed (lm-eval's rules, through its own helpers):
- loglikelihood: context + continuation in one forward; the continuation's log-probability and
  whether every one of its tokens is the argmax. Only the positions that predict a continuation
  go through lm_head, in float32: one (positions x vocabulary) buffer, normalised in place, and
  one copy to the host per batch. Longer than block_size + 1 tokens, the input is cut from the
  left (the context loses its start), as lm-eval's HF model does; a note says how many were cut.
  Requests are sorted by length and batched (right padding: causal models).
- loglikelihood_rolling: a document in windows of block_size predicted tokens
  (lm_eval.utils.get_rolling_token_windows, context_len=1): disjoint windows, every token
  predicted once, the first from the end-of-text token, the last window given a full context.
- generate_until: batched as lm-eval's HF model batches (requests with the same generation
  settings, longest first), each row its own tokens at its own positions (no padding: past the
  shortest prompt, a row still in its prompt is fed its next prompt token; a batch is cut where
  its prompts differ by more than max_gen_toks), with the KV cache; a row stops at any of the
  task's `until` strings or at end-of-text (GPT-2), the batch when every row has or after
  max_gen_toks tokens. Greedy unless the task samples: do_sample, temperature,
  top_k and top_p as Hugging Face's generate reads them (its defaults temperature 1, top_k 50,
  top_p 1; transformers' own logits warpers). The context keeps its last block_size -
  max_gen_toks tokens (the HF model's rule); a task asking for max_gen_toks >= block_size keeps
  its last block_size tokens and each new token is predicted from the last block_size (the
  window slides, as sample.py past block_size), with a note.
- Under torchrun (`torchrun --nproc_per_node=N eval.py ...`) the model joins the process group
  (gloo on CPU, NCCL on CUDA) and reports its rank and world size: lm-eval gives each process
  every N-th document and gathers the metrics on rank 0 (the protocol of its own models).
A character model has no end-of-text token: the newline stands in for it (where a document
starts, and the dummy first context of rolling windows). unknown_chars=drop leaves characters
outside its vocabulary out of prompts and contexts only: a scored text (a choice, a document)
that holds one is refused, since its log-likelihood would cover fewer characters than the
lengths, bytes and words lm-eval divides by (and an all-unknown choice would score 0 and win).
"""

import os
import sys
from pathlib import Path

from nanohfa import hub

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
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window  # noqa: E402
from tqdm import tqdm  # noqa: E402

from nanohfa import checkpoint  # noqa: E402
from nanohfa import devices  # noqa: E402
from nanohfa import tokenizer as tok  # noqa: E402
from nanohfa.errors import UserError  # noqa: E402
from model import KVCache  # noqa: E402

# the model arguments a user gives (eval.py's flags, compare.py --eval_model_args), with their defaults
MODEL_ARGS = {'meta': '', 'kernel': '', 'device': 'auto', 'dtype': 'auto', 'batch_size': 16, 'max_gen_toks': 256,
              'unknown_chars': 'error'}
UNKNOWN_CHARS_FIX = ("unknown_chars=drop (eval.py --unknown_chars=drop; compare.py --eval_model_args="
                     "unknown_chars=drop) leaves them out of prompts and contexts")


def load(path, meta='', kernel=''):
    """(model, tokenizer, checkpoint path) for an out_dir, a checkpoint file or GPT-2's weights."""
    p = Path(path)
    if p.is_dir() and (p / 'ckpt.pt').is_file():
        p = p / 'ckpt.pt'
    elif p.is_dir() and not (p / 'config.json').is_file():
        raise UserError(f"{path} holds no ckpt.pt (nor a Hugging Face config.json); train first, or give the "
                        f"out_dir of a finished run")
    elif not p.exists() and str(path) not in checkpoint.GPT2_NAMES:
        raise UserError(f"no checkpoint at {path}: give the out_dir of a training run (its ckpt.pt), a checkpoint "
                        f"file, or GPT-2's weights ({', '.join(checkpoint.GPT2_NAMES)}, or a save_pretrained folder)")
    if checkpoint.init_kind(str(p), ('gpt2', 'file')) == 'gpt2':
        return checkpoint.load_gpt2(str(p)), tok.GPT2Tokenizer(), p
    ckpt = checkpoint.load_checkpoint(p)
    model = checkpoint.model_from_checkpoint(ckpt, p, dropout=0.0, **({'kernel': kernel} if kernel else {}))
    return model, tok.from_meta(checkpoint.checkpoint_meta(ckpt, p, meta)), p


def join_processes(device):
    """(rank, world size, device): under torchrun, the process group (NCCL for CUDA, else gloo),
    joined here unless the caller has, and this process's own GPU; one process: (0, 1, device)."""
    if int(os.environ.get('WORLD_SIZE', '1')) <= 1:
        return 0, 1, device
    import torch.distributed as dist
    if device == 'cuda':
        device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
    if device.startswith('cuda'):
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group('nccl' if device.startswith('cuda') else 'gloo')
    return dist.get_rank(), dist.get_world_size(), device


@register_model('nanohfa')
class NanoHFA(TemplateLM):
    def __init__(self, path='', model=None, enc=None, meta='', kernel='', device='auto', dtype='auto',
                 batch_size=16, max_batch_size=None, max_gen_toks=256, unknown_chars='error', **unknown):
        super().__init__()
        if unknown:
            raise UserError(f"unknown model_args {', '.join(unknown)} for the nanohfa model; valid: path, "
                            f"{', '.join(MODEL_ARGS)}")
        if unknown_chars not in ('error', 'drop'):
            raise UserError(f"unknown_chars={unknown_chars!r}; valid: error, drop")
        self._rank, self._world_size, device = join_processes(devices.pick_device(device or 'auto'))
        if model is None:
            model, enc, path = load(path, meta, kernel)
        if not model.config.causal:
            raise UserError(f"{path} is a non-causal model (causal=False): it sees the tokens it predicts, so "
                            f"its log-likelihoods mean nothing; evaluate a causal (language) model")
        self._device = device
        self.dtype, self.ctx = devices.pick_dtype(dtype, self._device)
        self.model, self.enc, self.path = model.eval().to(self._device), enc, str(path)
        self.block_size = model.config.block_size
        self.batch_size = 16 if batch_size in (None, 'auto') or str(batch_size).startswith('auto') else int(batch_size)
        self.max_gen_toks, self.unknown_chars = int(max_gen_toks), unknown_chars
        self.truncated = 0  # loglikelihood requests cut from the left to fit block_size
        self.slid = 0       # generation requests of max_gen_toks >= block_size (their window slid)

    # -------------------------------------------------------------------------
    # processes: lm-eval's protocol (rank, world_size, all_gather, gather_object, barrier)

    def all_gather(self, tensor):
        if self.world_size == 1:
            return tensor
        import torch.distributed as dist
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.stack(parts) if tensor.dim() == 0 else torch.cat(parts)

    def gather_object(self, obj, dst=0):
        if self.world_size == 1:
            return [obj]
        import torch.distributed as dist
        parts = [None] * self.world_size
        dist.all_gather_object(parts, obj)  # the object collective both gloo and NCCL have
        return parts if self.rank == dst else None

    def barrier(self):
        if self.world_size > 1:
            import torch.distributed as dist
            dist.barrier()

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
            raise UserError(f"{e} (the task's text has them); {UNKNOWN_CHARS_FIX}") from None

    def tok_decode(self, ids):
        return self.enc.decode(ids)

    def check_scored(self, texts):
        """unknown_chars=drop: a text to be scored (a choice, a document) must hold no character the
        model lacks: dropping one would leave its log-likelihood over fewer characters than the
        lengths, bytes and words lm-eval divides by."""
        if self.enc.name != 'char' or self.unknown_chars != 'drop':
            return
        unknown = sorted(set(''.join(texts)) - self.enc.stoi.keys())
        if unknown:
            raise UserError(f"characters {''.join(unknown)!r} are in a text this task scores (a choice or a "
                            f"document), not only in its prompts: unknown_chars=drop would score that text without "
                            f"them against lm-eval's byte, word and length counts of the whole (bits per byte too "
                            f"good, an all-unknown choice winning); evaluate this task with a model whose "
                            f"vocabulary holds them (GPT-2's BPE)")

    # -------------------------------------------------------------------------
    # scoring

    def hidden(self, x):
        """The final layer norm's output at every position of x (B, T, C): the model's own forward
        (which applies lm_head to the last position alone)."""
        seen = []
        hook = self.model.transformer.ln_f.register_forward_hook(lambda module, args, out: seen.append(out))
        try:
            with self.ctx:
                self.model(x)
        finally:
            hook.remove()
        return seen[0]

    @torch.no_grad()
    def score(self, x, spans):
        """[(log p(targets), every target the argmax)] for each row of x (B, T), its span (start,
        targets): targets[j] predicted at position start + j. Only those positions go through lm_head,
        in float32: one (targets x vocabulary) buffer, normalised in place; one copy to the host."""
        rows = [b for b, (_, targets) in enumerate(spans) for _ in targets]
        cols = [start + j for start, targets in spans for j in range(len(targets))]
        target = torch.tensor([t for _, targets in spans for t in targets], device=x.device)
        h = self.hidden(x)[torch.tensor(rows, device=x.device), torch.tensor(cols, device=x.device)]
        logits = F.linear(h.float(), self.model.lm_head.weight.float())  # the one buffer
        picked = logits.gather(1, target[:, None]).squeeze(1)
        greedy = logits.argmax(1) == target
        top = logits.amax(1, keepdim=True)
        logp = picked - logits.sub_(top).exp_().sum(1).log_() - top.squeeze(1)  # log-softmax, in place
        longest = max(len(targets) for _, targets in spans)
        mask = torch.tensor([[j < len(targets) for j in range(longest)] for _, targets in spans], device=x.device)
        sums = torch.zeros(mask.shape, device=x.device).masked_scatter_(mask, logp).sum(1)  # per row, in order
        misses = torch.zeros(mask.shape, device=x.device).masked_scatter_(mask, (~greedy).float()).sum(1)
        sums, misses = torch.stack([sums, misses]).tolist()
        return [(s, m == 0) for s, m in zip(sums, misses)]

    def loglikelihood(self, requests, disable_tqdm=False):
        self.check_scored([r.args[1] for r in requests])
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm)

    def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
        """[(logprob, is_greedy)] of each ((context, continuation), context ids, continuation ids)."""
        order = Collator(requests, sort_fn=lambda r: (-len(r[1] + r[2]), tuple(r[1] + r[2])))
        out = []
        bar = tqdm(total=len(requests), disable=disable_tqdm or self.rank != 0, desc="loglikelihood requests")
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
            answers = self.score(x, [(len(i) - len(k), k) for i, (_, _, k) in zip(inputs, batch)])
            for (key, _, _), answer in zip(batch, answers):
                if key is not None:
                    self.cache_hook.add_partial('loglikelihood', key, answer)
            out += answers
            bar.update(len(batch))
        bar.close()
        return order.get_original(out)

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        self.check_scored([r.args[0] for r in requests])
        windows, owner = [], []
        for n, (text,) in enumerate(tqdm([r.args for r in requests], disable=disable_tqdm or self.rank != 0,
                                         desc="rolling windows")):
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

    def generate_until(self, requests, disable_tqdm=False):
        order = Collator([r.args for r in requests], sort_fn=lambda r: (-len(self.tok_encode(r[0])), r[0]),
                         group_by='gen_kwargs', group_fn=lambda r: r[1])
        out = []
        bar = tqdm(total=len(requests), disable=disable_tqdm or self.rank != 0, desc="generate_until")
        for batch in order.get_batched(n=self.batch_size):
            for part in self.similar_lengths(batch):
                texts = self.generate(*zip(*part))
                for (context, gen_kwargs), text in zip(part, texts):
                    self.cache_hook.add_partial('generate_until', (context, gen_kwargs), text)
                out += texts
                bar.update(len(part))
        bar.close()
        return order.get_original(out)

    def similar_lengths(self, batch):
        """A batch (longest prompt first) cut where a prompt is shorter than the first of its part by more
        than max_gen_toks: a row is fed its prompt a token a step while a shorter one generates, so a part
        takes at most twice the steps of its generation."""
        n_new = normalize_gen_kwargs(batch[0][1], self.max_gen_toks)['max_gen_toks']
        parts = []
        for request in batch:
            length = len(self.tok_encode(request[0]))
            if not parts or parts[-1][0] - length > n_new:
                parts.append((length, []))
            parts[-1][1].append(request)
        return [part for _, part in parts]

    def generate(self, contexts, all_gen_kwargs):
        """The generated text of each context, under the one generation setting all share."""
        kw = normalize_gen_kwargs(all_gen_kwargs[0], self.max_gen_toks)
        until = handle_stop_sequences(kw.pop('until', None), eos=self.tok_decode([self.eot_token_id])
                                      if self.enc.name == 'gpt2' else None)
        n_new = kw.pop('max_gen_toks')
        sampler = self.sampler(kw)
        if n_new >= self.block_size:
            self.slid += len(contexts)
        room = self.block_size - n_new if n_new < self.block_size else self.block_size
        prompts = [self.tok_encode(c)[-room:] or [self.eot_token_id] for c in contexts]
        return [postprocess_generated_text(self.tok_decode(ids), until, None)
                for ids in self.continue_rows(prompts, n_new, until, sampler)]

    @staticmethod
    def sampler(kw):
        """None (greedy), or the logits warpers of Hugging Face's generate for do_sample, temperature,
        top_k and top_p, in its order and with its defaults; any other setting is refused."""
        other = {k: v for k, v in kw.items() if k not in ('do_sample', 'temperature', 'top_k', 'top_p')
                 and not (k == 'num_beams' and v == 1)}
        if other:
            raise UserError(f"the task's generation settings {other} are not supported by the nanohfa model (it "
                            f"decodes greedily or samples with temperature, top_k and top_p)")
        if not kw.get('do_sample'):
            return None
        temperature = float(kw.get('temperature', 1.0))
        top_k, top_p = kw.get('top_k', 50), float(kw.get('top_p', 1.0))
        if temperature <= 0:
            raise UserError(f"the task asks to sample (do_sample=True) at temperature={temperature}; a sampling "
                            f"temperature must be > 0 (or do_sample=False for greedy decoding), as in "
                            f"Hugging Face's generate")
        from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper,
                                                            TopKLogitsWarper, TopPLogitsWarper)
        return LogitsProcessorList(([TemperatureLogitsWarper(temperature)] if temperature != 1.0 else [])
                                   + ([TopKLogitsWarper(int(top_k))] if top_k else [])
                                   + ([TopPLogitsWarper(top_p)] if top_p < 1.0 else []))

    @torch.no_grad()
    def continue_rows(self, prompts, n_new, until, sampler):
        """The new token ids of each prompt, decoded together. Every row holds its own tokens at its own
        positions: the shortest prompts start generating while a longer one is still fed its prompt,
        one token a step, so no row is padded and each sees what it would alone. A row stops at a
        stop string or end-of-text; past block_size tokens each is predicted from the last block_size."""
        T, B = self.block_size, len(prompts)
        lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        start, end = min(len(p) for p in prompts), max(len(p) for p in prompts) + n_new
        seq = torch.tensor([p + [0] * (end - len(p)) for p in prompts], device=self.device)
        eot = self.enc.eot if self.enc.name == 'gpt2' else None
        look = 4 * max((len(s) for s in until), default=0) + 8  # tokens enough to hold any stop string
        new, done = [[] for _ in prompts], [False] * B
        cache = KVCache(self.model.config.n_layer)
        with self.ctx:
            logits, _ = self.model(seq[:, :start], cache=cache)
        pos = start  # the position whose token is chosen now
        while True:
            scores = logits[:, -1, :].float()
            token = scores.argmax(-1) if sampler is None else \
                torch.multinomial(F.softmax(sampler(None, scores), dim=-1), 1).squeeze(1)
            seq[:, pos] = torch.where(lengths > pos, seq[:, pos], token)  # a row still in its prompt keeps it
            chosen = token.tolist()
            for i in range(B):
                if done[i] or len(prompts[i]) > pos:
                    continue
                new[i].append(chosen[i])
                done[i] = len(new[i]) >= n_new or chosen[i] == eot or (
                    any(s and s in self.tok_decode(new[i][-look:]) for s in until))
            if all(done):
                return new
            pos += 1
            with self.ctx:
                if pos <= T:  # the sequence fits: one more token through the cache
                    logits, _ = self.model(seq[:, pos - 1:pos], cache=cache)
                else:  # past block_size: the last block_size tokens, recomputed
                    logits, _ = self.model(seq[:, pos - T:pos])

    def get_model_info(self):
        return {'path': self.path, 'params': self.model.get_num_params(), 'attention': self.model.config.attention,
                'kernel': self.model.config.kernel, 'block_size': self.block_size, 'tokenizer': self.tokenizer_name,
                'dtype': self.dtype}


def note_cuts(lm):
    """One line on stderr for each kind of cut the requests needed (counted over every process);
    a collective under torchrun: every process calls it."""
    counts = torch.tensor([lm.truncated, lm.slid], device=lm.device)
    truncated, slid = (lm.all_gather(counts).view(-1, 2).sum(0) if lm.world_size > 1 else counts).tolist()
    if lm.rank:
        return
    if truncated:
        print(f"note: {truncated} request(s) longer than block_size={lm.block_size} tokens were cut from the "
              f"left (their context's start), as lm-eval's HF model does", file=sys.stderr)
    if slid:
        print(f"note: {slid} generation request(s) asked for max_gen_toks >= block_size={lm.block_size}: their "
              f"context kept its last {lm.block_size} tokens and each new token was predicted from the last "
              f"{lm.block_size} (the window slid)", file=sys.stderr)
