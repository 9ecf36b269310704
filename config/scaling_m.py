# Scaling study, size M of three: GPT-3 Small's shape (12 layers x 768 wide, 12 heads of 64, context 1024),
# 123.6M parameters (SA), 2.47B tokens. Everything else as config/scaling_s.py, whose header explains
# the variants (sa, sa_w512, ha_w, ha4_w), the 20 tokens per parameter and the learning rates.
#   python compare.py --config config/scaling_m.py --gpus 0-7 --out out-scaling-m   (--dry_run: every run, its cost)
# ha_w: head width 40 (SA's parameter count); ha4_w: HA in layers 4, 8 and 12, +2.9% parameters.
# Budget: 2.47B tokens (5,029 iterations x 491,520), 0.80 GFLOPs/token, 1.99e+18 FLOPs, 1.9 GPU-hours on H100 at 30% MFU = 14 min on 8 x H100
# Grid budget: 12 runs (4 variants x 3 seeds), 29.7B tokens, 3.22e+19 FLOPs, 30 GPU-hours on H100 at 30% MFU = 5.5 h on 8 GPUs
from config.scaling_s import *  # the study's recipe; only the size differs
from config.scaling_s import _compare as _compare_s

_compare = dict(_compare_s, preset=[
    ['sa_w512', 'attention=sa', 'attn_window=512'],
    ['ha_w', 'attention=ha', 'ha_share_kv=False', 'ha_window1=512', 'ha_window2=32', 'head_dim=40'],
    ['ha4_w', 'attn_layers=' + ','.join(['sa', 'sa', 'sa', 'ha'] * 3), 'ha_share_kv=False', 'ha_window1=512',
     'ha_window2=32'],
])
out_dir = 'out-scaling-m'
wandb_run_name = 'scaling-m'

n_layer = 12
n_head = 12
n_embd = 768
gradient_accumulation_steps = 40  # 491,520 tokens per iteration
max_iters = 5029                  # 20 x 123,587,328 parameters / 491,520
lr_decay_iters = 5029
warmup_iters = 251
learning_rate = 6e-4              # GPT-3 Small's
min_lr = 6e-5
