# HyperAttention, order 3 ([IA] Def 6.1; [IA] Sec. 7.2 "HA, no weight sharing" row, reported val ppl
# 48.50) at GPT-2 small on OpenWebText, the sa recipe.
#   torchrun --standalone --nproc_per_node=8 train.py config/ha.py
# Full order-3 HA costs O(T^2) key pairs per query (~350k pairs at T = 1024), out of reach at this
# context. So, as 2-simplicial attention (Roy et al. 2025, the same trilinear form): HA in every 4th
# layer, j1 in the last 512 positions and j2 in the last 32; SA elsewhere.
# Budget: 24.58B tokens (50,000 iterations x 491,520), 1.14 GFLOPs/token, 2.82e+19 FLOPs, 26.4 GPU-hours on H100 at 30% MFU = 3.3 h on 8 x H100
# Set attention='ha', attn_layers='' and drop the windows for the paper's all-HA model (a
# block_size of ~128 is then affordable; see its cost with compare.py --dry_run). ha_share_kv=True
# gives the weight-shared HA row (reported 51.26).
from config.sa import *  # the shared recipe; only what follows differs

out_dir = 'out-ha'
wandb_run_name = 'ha'
attn_layers = 'sa,sa,sa,ha,sa,sa,sa,ha,sa,sa,sa,ha'
ha_order = 3
ha_share_kv = False
ha_window1 = 512
ha_window2 = 32
