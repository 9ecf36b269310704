# OpenWebText, GPT-3-small-like model: HyperAttention as owt_gpt3small_ha.py, with weight sharing (K2 = K1, V2 = V1).
#   torchrun --standalone --nproc_per_node=8 train.py config/owt_gpt3small_ha_share.py
# Budget: 4.92B tokens (10,000 iterations x 491,520), 1.12 GFLOPs/token, 5.56e+18 FLOPs, 5.2 GPU-hours on H100 at 30% MFU = 39 min on 8 x H100
# Several seeds and the table: python compare.py --config config/owt_gpt3small_sa.py \
#   --variants sa,hfa,hfa_v2 --gpus 0-7 --out out-owt-gpt3small   (see RESULTS.md)
from config.owt_gpt3small_ha import *  # the HA recipe; only the weight sharing differs

out_dir = 'out-owt-gpt3small-ha_share'
wandb_run_name = 'gpt3small-ha_share'
ha_share_kv = True
