# GPT-2 small (124M) with softmax self-attention on FineWeb's 10B-token sample, in the shards
# llm.c and the modded-nanogpt speedrun download: data/fineweb10B/fineweb_val_000000.bin and
# fineweb_train_000001.bin ... (100M GPT-2 tokens each, llm.c's header; modded-nanogpt's
# `python data/cached_fineweb10B.py` fetches them, llm.c's dev/data/fineweb.py writes them).
# train.py reads them as they are: no conversion, no meta.json (the header says GPT-2 tokens).
#   torchrun --standalone --nproc_per_node=8 train.py config/fineweb10B_sa.py
# 12 x 1024 x 40 = 491,520 tokens per iteration; 20,000 iterations = 9.8B tokens, about one pass.
# Budget: 9.83B tokens (20,000 iterations x 491,520), 0.80 GFLOPs/token, 7.87e+18 FLOPs, 7.4 GPU-hours on H100 at 30% MFU = 55 min on 8 x H100
from config.sa import *  # GPT-2 small, nanoGPT's recipe; only the data and the length differ

out_dir = 'out-fineweb10B-sa'
wandb_run_name = 'fineweb10B-sa'
dataset = 'fineweb10B'
data_dir = 'data/fineweb10B'  # the shards' folder (relative to where train.py runs); or an absolute path
max_iters = 20000
lr_decay_iters = 20000
warmup_iters = 700
