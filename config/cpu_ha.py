# CPU companion of config/ha.py: the cpu_sa model with order-3 HA in every layer, windowed
# (2-simplicial style: j1 in the last 16 positions, j2 in the last 8) so that it fits 2 CPU
# cores: full HA at T = 128 is ~8x the FLOPs of sa per token and ~16x slower here. Half the
# iterations of cpu_sa (300 x 32 x 128 tokens), so NOT token-matched with cpu_sa: use
# compare.py for matched comparisons. Full [IA] HA instead: ha_window1 = ha_window2 = 0 with
# block_size = 64 (~13x slower than sa). ha_share_kv=True: the weight-shared HA.
#   python train.py config/cpu_ha.py
from config.cpu_sa import *  # the shared recipe; only what follows differs

max_iters = 300
lr_decay_iters = 300
out_dir = 'out-cpu-ha'
attention = 'ha'
ha_order = 3
ha_share_kv = False
ha_window1 = 16
ha_window2 = 8
