"""
A GPT of model.py as a Hugging Face transformers model: export_hf.py copies this file into the
folder it writes (as modeling_nanohfa.py, beside model.py and the attention code model.py
imports), so that

    AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)

builds model.py's own GPT. Nothing here computes attention or anything else of the model:
NanoHFAConfig holds GPTConfig's fields, NanoHFAForCausalLM holds one GPT and calls it.
What transformers needs from a causal language model is added around it:

- forward returns the logits of every position (of the last only when `generate` asks with
  logits_to_keep=1) and, given labels, model.py's loss of predicting labels[t + 1] at
  position t (-100: not scored), transformers' convention;
- the cache of keys and values is model.py's own (KVCache: HyperAttention keeps several key
  streams per head, which transformers' caches do not hold), passed back through `generate`;
- prepare_inputs_for_generation decodes as GPT.generate does: the cache while the sequence fits
  in block_size, past it the last block_size tokens recomputed at every step. Greedy search
  (do_sample=False) therefore gives sample.py's --temperature=0 tokens.

No padding: positions are absolute (learned position embeddings) and the attention reads every
earlier token, so a batch of prompts of different lengths cannot be one tensor. An
attention_mask with zeros is refused (lm-eval: batch_size=1 for generation tasks; its
log-likelihood batches pad on the right, which a causal model never reads). Beam search and
assisted decoding, which reorder or crop the cache, are not supported.
"""

from dataclasses import fields

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from model import GPT, GPTConfig, KVCache

# the name transformers gives the cache in a model's inputs and outputs: `cache` from 5.x, `past_key_values` before
CACHE = 'cache' if 'cache' in CausalLMOutputWithPast.__dataclass_fields__ else 'past_key_values'


class NanoHFAConfig(PretrainedConfig):
    """GPTConfig's fields (settings.py documents each) under their own names, plus transformers'."""
    model_type = 'nanohfa'
    attribute_map = {'hidden_size': 'n_embd', 'num_hidden_layers': 'n_layer', 'num_attention_heads': 'n_head',
                     'max_position_embeddings': 'block_size'}

    def __init__(self, **kwargs):
        for f in fields(GPTConfig):
            setattr(self, f.name, kwargs.pop(f.name, f.default))
        self.use_cache = kwargs.pop('use_cache', True)
        kwargs.setdefault('tie_word_embeddings', True)  # lm_head is the token embedding, as GPT-2
        super().__init__(**kwargs)

    def gpt_config(self):
        return GPTConfig(**{f.name: getattr(self, f.name) for f in fields(GPTConfig)})


class NanoHFACache(KVCache):
    """model.py's cache of keys and values, with what transformers' generation loop asks of one."""
    is_compileable = False
    is_croppable = False

    def get_seq_length(self, layer_idx=0):
        return self.pos


class NanoHFAForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = NanoHFAConfig
    base_model_prefix = 'gpt'
    main_input_name = 'input_ids'
    _tied_weights_keys = {'gpt.lm_head.weight': 'gpt.transformer.wte.weight'}
    _no_split_modules = ['Block']
    accepts_loss_kwargs = False  # the loss is model.py's, a mean over the scored tokens: the Trainer scales it

    def __init__(self, config):
        super().__init__(config)
        self.gpt = GPT(config.gpt_config())
        self.post_init()

    def _init_weights(self, module):
        """Nothing: GPT initialises its own weights (GPT-2's scheme); from_pretrained loads them all."""

    @classmethod
    def _supports_default_dynamic_cache(cls):
        return False  # the cache is model.py's (NanoHFACache), made by forward

    def get_input_embeddings(self):
        return self.gpt.transformer.wte

    def set_input_embeddings(self, value):
        self.gpt.transformer.wte = value

    def get_output_embeddings(self):
        return self.gpt.lm_head

    def set_output_embeddings(self, value):
        self.gpt.lm_head = value

    def forward(self, input_ids, attention_mask=None, labels=None, use_cache=None, logits_to_keep=0,
                position_ids=None, return_dict=None, **kwargs):
        cache = kwargs.pop(CACHE, None)
        B, T = input_ids.shape
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("nanohfa models take no padding (an attention_mask with zeros): give prompts one at a "
                             "time (lm-eval: batch_size=1 for generation tasks)")
        offset = cache.pos if cache is not None else 0
        if position_ids is not None and not torch.equal(position_ids.cpu(),
                                                        torch.arange(offset, offset + T).expand(B, T)):
            raise ValueError("nanohfa models take no position_ids other than the tokens' own positions")
        if cache is None and (use_cache if use_cache is not None else self.config.use_cache) and not self.training:
            cache = NanoHFACache(self.config.n_layer)
        loss = None
        if labels is not None:  # transformers' labels (position t predicts labels[t + 1]; -100: not scored)
            targets = torch.cat([labels[:, 1:], labels.new_full((B, 1), -100)], 1)
            logits, loss = self.gpt(input_ids, targets=targets.masked_fill(targets == -100, -1), cache=cache)
        elif logits_to_keep == 1:  # generate: the last position's logits only
            logits, _ = self.gpt(input_ids, cache=cache)
        else:  # targets make GPT.forward return every position's logits (its loss is not used)
            logits, _ = self.gpt(input_ids, targets=input_ids, cache=cache)
            if logits_to_keep:
                logits = logits[:, -logits_to_keep:]
        out = CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE: cache})
        return out if return_dict is not False else out.to_tuple()

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, use_cache=True, **kwargs):
        """The tokens the next forward reads, as GPT.generate chooses them: those the cache has not
        seen while the sequence fits in block_size; past it, the last block_size tokens, no cache."""
        cache = kwargs.get(CACHE)
        if input_ids.size(1) > self.config.block_size:
            input_ids, cache, use_cache = input_ids[:, -self.config.block_size:], None, False
        elif cache is not None:
            input_ids = input_ids[:, cache.pos:]
        return {'input_ids': input_ids, 'attention_mask': attention_mask, 'use_cache': use_cache, CACHE: cache,
                'logits_to_keep': kwargs.get('logits_to_keep', 0)}
