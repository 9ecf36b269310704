# OpenWebText, GPT-3-small-like model: HyperFeatureAttention v2 (Hadamard-product values) in every layer.
#   torchrun --standalone --nproc_per_node=8 train.py config/owt_gpt3small_hfa_v2.py
# Budget: 4.92B tokens (10,000 iterations x 491,520), 0.95 GFLOPs/token, 4.72e+18 FLOPs, 4.4 GPU-hours on H100 at 30% MFU = 33 min on 8 x H100
# Several seeds and the table: python compare.py --config config/owt_gpt3small_sa.py \
#   --variants sa,hfa,hfa_v2 --gpus 0-7 --out out-owt-gpt3small   (see RESULTS.md)
from config.owt_gpt3small_sa import *  # the shared recipe; only what follows differs

out_dir = 'out-owt-gpt3small-hfa_v2'
wandb_run_name = 'gpt3small-hfa_v2'
attention = 'hfa_v2'
hfa_order = 2
compile = True
