# OpenWebText, GPT-3-small-like model: HyperAttention as owt_gpt3small_ha.py, with weight sharing (K2 = K1, V2 = V1).
#   torchrun --standalone --nproc_per_node=8 train.py config/owt_gpt3small_ha_share.py
# Several seeds and the table: python compare.py --config config/owt_gpt3small_sa.py \
#   --variants sa,hfa,hfa_v2 --nproc 8 --out out-owt-gpt3small   (see RESULTS.md)
from config.owt_gpt3small_ha import *  # the HA recipe; only the weight sharing differs

out_dir = 'out-owt-gpt3small-ha_share'
wandb_run_name = 'gpt3small-ha_share'
ha_share_kv = True
