# Linear self-attention ([IA] Eq. 1: the softmax removed) at GPT-2 small on OpenWebText.
# Same recipe as config/sa.py; only the attention changes. Parameters equal to sa.
#   torchrun --standalone --nproc_per_node=8 train.py config/linear.py
from config.sa import *  # the shared recipe; only what follows differs

out_dir = 'out-linear'
wandb_run_name = 'linear'
attention = 'linear'
# Our choice (README, `linear_norm`): divide by the number of visible keys, i + 1. Unnormalised sums over
# 1024 keys grow with position; set False for the literal [IA] Eq. 1 form.
linear_norm = True
