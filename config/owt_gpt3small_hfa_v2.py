# OpenWebText, GPT-3-small-like model: HyperFeatureAttention v2 (Hadamard-product values) in every layer.
#   torchrun --standalone --nproc_per_node=8 train.py config/owt_gpt3small_hfa_v2.py
# Several seeds and the table: python compare.py --config config/owt_gpt3small_sa.py \
#   --variants sa,hfa,hfa_v2 --nproc 8 --out out-owt-gpt3small   (see RESULTS.md)
from config.owt_gpt3small_sa import *  # the shared recipe; only what follows differs

out_dir = 'out-owt-gpt3small-hfa_v2'
wandb_run_name = 'gpt3small-hfa_v2'
attention = 'hfa_v2'
hfa_order = 2
compile = True
