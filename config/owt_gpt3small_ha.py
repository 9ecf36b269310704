# OpenWebText, GPT-3-small-like model: HyperAttention (order 3, no weight sharing). Full causal HA costs O(T^3) per head,
# out of reach at T = 1024, so this follows Roy et al. 2025 (2-simplicial attention):
# HA in every 4th layer, j1 in the last 512 and j2 in the last 32 positions; SA elsewhere.
# [IA]'s own LM setup (HA everywhere? windows?) is not known (RESULTS.md).
#   torchrun --standalone --nproc_per_node=8 train.py config/owt_gpt3small_ha.py
# Budget: 4.92B tokens (10,000 iterations x 491,520), 1.14 GFLOPs/token, 5.67e+18 FLOPs, 5.3 GPU-hours on H100 at 30% MFU = 40 min on 8 x H100
# Several seeds and the table: python compare.py --config config/owt_gpt3small_sa.py \
#   --variants sa,hfa,hfa_v2 --gpus 0-7 --out out-owt-gpt3small   (see RESULTS.md)
from config.owt_gpt3small_sa import *  # the shared recipe; only what follows differs

out_dir = 'out-owt-gpt3small-ha'
wandb_run_name = 'gpt3small-ha'
attention = 'sa'
attn_layers = 'sa,sa,sa,ha,sa,sa,sa,ha,sa,sa,sa,ha'
ha_share_kv = False
ha_window1 = 512
ha_window2 = 32
compile = True
