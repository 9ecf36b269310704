# HyperFeatureAttention hfa_v1 ([IA] Def 5.1): per head, scores = (Q1 K1^T/sqrt dh) * (Q2 K2^T/sqrt dh),
# one softmax after the product, plain values. GPT-2 small on OpenWebText, the sa recipe
# ([IA] Sec. 7.2 "HFA" row, reported val ppl 60.22).
#   torchrun --standalone --nproc_per_node=8 train.py config/hfa.py
# Budget: 24.58B tokens (50,000 iterations x 491,520), 0.91 GFLOPs/token, 2.25e+19 FLOPs, 21.0 GPU-hours on H100 at 30% MFU = 2.6 h on 8 x H100
# dh = 64 here (d/H): 2A+1 = 5 projection streams per head, +2 x 768 x 768 parameters per
# layer vs sa. For an equal-width comparison use head_dim = n_embd // (n_head * hfa_order) = 32;
# for [IA]'s hybrid use n_hfa_head = 6 (6 SA + 6 HFA heads in every layer).
from config.sa import *  # the shared recipe; only what follows differs

out_dir = 'out-hfa'
wandb_run_name = 'hfa_v1'
attention = 'hfa_v1'
hfa_order = 2
n_hfa_head = -1   # all heads HFA
head_dim = 0      # 0: n_embd // n_head = 64
