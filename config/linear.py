# Linear self-attention ([IA] Eq. 1: the softmax removed) at GPT-2 small on OpenWebText.
# Same recipe as config/sa.py; only the attention changes. Parameters equal to sa.
#   torchrun --standalone --nproc_per_node=8 train.py config/linear.py
# Budget: 24.58B tokens (50,000 iterations x 491,520), 0.80 GFLOPs/token, 1.97e+19 FLOPs, 18.4 GPU-hours on H100 at 30% MFU = 2.3 h on 8 x H100
from config.sa import *  # the shared recipe; only what follows differs

out_dir = 'out-linear'
wandb_run_name = 'linear'
attention = 'linear'
# Our choice (README, `linear_norm`): divide by the number of visible keys, i + 1. Unnormalised sums over
# 1024 keys grow with position; set False for the literal [IA] Eq. 1 form.
linear_norm = True
