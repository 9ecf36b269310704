# nanoGPT's full GPT-2 (124M) recipe, LONG: 600,000 iterations = 295B tokens, more than a day on
# one 8-GPU node (nanoGPT: ~4 days on 8 x A100 to val loss ~2.85). The one config here that does
# not fit a day; config/sa.py is the same model at a day-sized budget.
#   torchrun --standalone --nproc_per_node=8 train.py config/sa_nanogpt.py
# Budget: 294.91B tokens (600,000 iterations x 491,520), 0.80 GFLOPs/token, 2.36e+20 FLOPs, 221.1 GPU-hours on H100 at 30% MFU = 27.6 h on 8 x H100
from config.sa import *  # the model and optimiser; only the schedule differs

out_dir = 'out-sa-nanogpt'
wandb_run_name = 'sa-nanogpt'
max_iters = 600000
lr_decay_iters = 600000
