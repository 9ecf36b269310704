# OpenWebText, GPT-3-small-like model: HyperFeatureAttention v1 (2 factors, plain values) in every layer; the lifted-query
# SDPA path needs dh^2 = 4096 > 256, so it materialises T x T scores (hfa_kron='auto').
#   torchrun --standalone --nproc_per_node=8 train.py config/owt_gpt3small_hfa.py
# Budget: 4.92B tokens (10,000 iterations x 491,520), 0.91 GFLOPs/token, 4.51e+18 FLOPs, 4.2 GPU-hours on H100 at 30% MFU = 32 min on 8 x H100
# Several seeds and the table: python compare.py --config config/owt_gpt3small_sa.py \
#   --variants sa,hfa,hfa_v2 --gpus 0-7 --out out-owt-gpt3small   (see RESULTS.md)
from config.owt_gpt3small_sa import *  # the shared recipe; only what follows differs

out_dir = 'out-owt-gpt3small-hfa'
wandb_run_name = 'gpt3small-hfa'
attention = 'hfa_v1'
hfa_order = 2
compile = True
