# OpenWebText, GPT-3-small-like model: HyperFeatureAttention v1 (2 factors, plain values) in every layer; the lifted-query
# SDPA path needs dh^2 = 4096 > 256, so it materialises T x T scores (hfa_kron='auto').
#   torchrun --standalone --nproc_per_node=8 train.py config/owt_gpt3small_hfa.py
# Several seeds and the table: python compare.py --config config/owt_gpt3small_sa.py \
#   --variants sa,hfa,hfa_v2 --nproc 8 --out out-owt-gpt3small   (see RESULTS.md)
from config.owt_gpt3small_sa import *  # the shared recipe; only what follows differs

out_dir = 'out-owt-gpt3small-hfa'
wandb_run_name = 'gpt3small-hfa'
attention = 'hfa_v1'
hfa_order = 2
compile = True
