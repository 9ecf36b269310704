# Scaling study, size S of three (config/scaling_s.py, scaling_m.py, scaling_l.py): does HA's three-way
# term help beyond locality as the model grows? SA, windowed SA and HA on OpenWebText, 3 seeds, every
# run on 20 tokens per parameter. One command per size on an 8-GPU node (one GPU per run):
#   python compare.py --config config/scaling_s.py --gpus 0-7 --out out-scaling-s   (--dry_run: every run, its cost)
# Variants (the presets in _compare below; every variant of a size sees the same tokens):
# - sa:      softmax self-attention in every layer, the reference.
# - sa_w512: sliding-window SA, each query reads the last 512 positions: HA's reach without its
#            three-way term (the locality control of RESULTS.md, there at window 16).
# - ha_w:    HA (order 3, its own K2 and V2, no weight sharing) in every layer, j1 in the last 512
#            positions and j2 in the last 32: the windows of 2-simplicial attention (Roy et al. 2025,
#            arXiv 2507.02754), which a context of 1024 holds. Head width 40, not 64: the multiple of 8
#            whose parameter count is closest to SA's (tests/test_scaling_preset.py checks it).
# - ha4_w:   the same HA in every 4th layer, SA in the others, as Roy et al. place it; head width 64,
#            so its extra K2, V2 projections add 2-4% parameters (2.1% at this size).
# Tokens: 20 per parameter (the compute-optimal ratio of Hoffmann et al. 2022) of SA's count (nanoGPT's:
# the position embedding left out), one cosine schedule per run with 5% warmup. OpenWebText's 9.0B
# training tokens hold this up to about 450M parameters, so the largest size is scaling_l (354M).
# Learning rate: GPT-3's (Brown et al. 2020, Table 2.1) at the nearest size, the same for every variant
# (not tuned per variant). Every evaluation reads the selection half of the held-out documents, and
# each run ends with report_loss, the loss on every window of the report half (report_split).
# The GPU-hours below assume 30% MFU for every variant, as every config here does; HA's MFU on a GPU is
# not measured yet (docs/performance.md), so its runs may take longer than stated.
# Size S: 8 layers x 512 wide, 8 heads of 64, context 1024, 50.9M parameters (SA), 1.02B tokens.
# Budget: 1.02B tokens (4,145 iterations x 245,760), 0.33 GFLOPs/token, 3.42e+17 FLOPs, 19.2 GPU-minutes on H100 at 30% MFU = 2 min on 8 x H100
# Grid budget: 12 runs (4 variants x 3 seeds), 12.2B tokens, 5.64e+18 FLOPs, 5 GPU-hours on H100 at 30% MFU = 1.0 h on 8 GPUs
from config.owt_gpt3small_sa import *  # the OpenWebText recipe; only what follows differs

_compare = dict(variants='sa,sa_w512,ha_w,ha4_w', seeds='3', preset=[
    ['sa_w512', 'attention=sa', 'attn_window=512'],
    ['ha_w', 'attention=ha', 'ha_share_kv=False', 'ha_window1=512', 'ha_window2=32', 'head_dim=40'],
    ['ha4_w', 'attn_layers=sa,sa,sa,ha,sa,sa,sa,ha', 'ha_share_kv=False', 'ha_window1=512', 'ha_window2=32'],
])
out_dir = 'out-scaling-s'
wandb_run_name = 'scaling-s'
report_split = True

n_layer = 8
n_head = 8
n_embd = 512
block_size = 1024
batch_size = 12
gradient_accumulation_steps = 20  # 245,760 tokens per iteration
max_iters = 4145                  # 20 x 50,930,176 parameters / 245,760
lr_decay_iters = 4145
warmup_iters = 207
learning_rate = 6e-4              # GPT-3 Small's
min_lr = 6e-5
