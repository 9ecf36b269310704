# HyperFeatureAttention hfa_v2 ([IA] Def E.2): as hfa_v1 but the value is also a Hadamard
# product, V = (X W_V1) * (X W_V2). GPT-2 small on OpenWebText, the sa recipe.
#   torchrun --standalone --nproc_per_node=8 train.py config/hfa_v2.py
# Budget: 24.58B tokens (50,000 iterations x 491,520), 0.95 GFLOPs/token, 2.35e+19 FLOPs, 22.0 GPU-hours on H100 at 30% MFU = 2.8 h on 8 x H100
# 3A = 6 projection streams per head (+3 x 768 x 768 parameters per layer vs sa).
from config.sa import *  # the shared recipe; only what follows differs

out_dir = 'out-hfa_v2'
wandb_run_name = 'hfa_v2'
attention = 'hfa_v2'
hfa_order = 2
n_hfa_head = -1
head_dim = 0
