# Scaling study, size L of three: GPT-3 Medium's shape (24 layers x 1024 wide, 16 heads of 64, context
# 1024), 353.6M parameters (SA), 7.07B tokens (0.79 epochs of OpenWebText). Everything else as
# config/scaling_s.py, whose header explains the variants (sa, sa_w512, ha_w, ha4_w), the 20 tokens
# per parameter and the learning rates. LONG: the grid takes more than a day on one 8-GPU node.
#   python compare.py --config config/scaling_l.py --gpus 0-7 --out out-scaling-l   (--dry_run: every run, its cost)
# ha_w: head width 40 (SA's parameter count); ha4_w: HA in every 4th of the 24 layers, +3.6% parameters.
# Budget: 7.07B tokens (14,386 iterations x 491,520), 2.27 GFLOPs/token, 1.62e+19 FLOPs, 15.1 GPU-hours on H100 at 30% MFU = 1.9 h on 8 x H100
# Grid budget: 12 runs (4 variants x 3 seeds), 84.9B tokens, 2.58e+20 FLOPs, 241 GPU-hours on H100 at 30% MFU = 43.9 h on 8 GPUs
from config.scaling_s import *  # the study's recipe; only the size differs
from config.scaling_s import _compare as _compare_s

_compare = dict(_compare_s, preset=[
    ['sa_w512', 'attention=sa', 'attn_window=512'],
    ['ha_w', 'attention=ha', 'ha_share_kv=False', 'ha_window1=512', 'ha_window2=32', 'head_dim=40'],
    ['ha4_w', 'attn_layers=' + ','.join(['sa', 'sa', 'sa', 'ha'] * 6), 'ha_share_kv=False', 'ha_window1=512',
     'ha_window2=32'],
])
out_dir = 'out-scaling-l'
wandb_run_name = 'scaling-l'

n_layer = 24
n_head = 16
n_embd = 1024
gradient_accumulation_steps = 40  # 491,520 tokens per iteration
max_iters = 14386                 # 20 x 353,551,360 parameters / 491,520
lr_decay_iters = 14386
warmup_iters = 719
learning_rate = 3e-4              # GPT-3 Medium's
min_lr = 3e-5
