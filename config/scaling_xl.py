# Scaling study, size XL: about 3B parameters, where 2-simplicial attention is reported to start
# helping (Roy et al. 2025, arXiv 2507.02754: no gain at 1B active parameters, gains at 2-3.5B).
# 36 layers x 2560 wide, 40 heads of 64, context 1024: 2.96B parameters (SA). Two variants, one seed:
# - sa:    softmax attention in every layer;
# - ha4_w: HA (order 3, its own K2 and V2) in every 4th layer, j1 in the last 512 positions and j2
#          in the last 32, SA in the others: Roy et al.'s placement and windows, as config/ha.py;
#          3.08B parameters (+4.0%).
# Everything else as config/scaling_s.py (its header explains the recipe). Tokens: 20 per SA
# parameter, 59.2B: 6.6 epochs of OpenWebText's 9.0B; for one pass, prepare a larger corpus
# (prepare_openwebtext.py --hf_id=... --name=X) and add --dataset=X. Learning rate: GPT-3 2.7B's.
# One run takes the whole node (FSDP over its 8 GPUs, nproc=8), the runs one after the other:
#   python compare.py --config config/scaling_xl.py --gpus 0-7 --out out-scaling-xl   (--dry_run: every run, its cost)
#   torchrun --standalone --nproc_per_node=8 train.py config/scaling_xl.py   (one run)
# Why FSDP: DDP keeps fp32 weights, gradients, DDP's gradient buckets and AdamW's two moments
# (20 bytes per parameter) plus autocast's bf16 weights on every GPU: 65 GB before activations.
# Memory per GPU on 8 x 80 GB, GB (1e9 bytes), from hardware.training_memory: bf16 autocast, AdamW,
# micro-batch 8 x 1024 per GPU, 16 micro-steps per GPU and iteration (FSDP adds gradients up
# unsharded in fp32 until the last, the 11.8 GB of its gradient column); CUDA context, NCCL
# buffers and fragmentation not counted (keep ~10% free). DDP does not fit; with checkpointing it
# leaves too little for them; FSDP fits without checkpointing (this preset: no recomputation, so
# no third more compute), and with it has room for micro-batches of 16 and more.
#   variant setup                  params  grads  AdamW bf16 w activ. logits  total
#   sa     DDP                     11.9   23.7   23.7    5.9   25.7    4.9   95.8
#   sa     DDP + checkpointing     11.9   23.7   23.7    5.9    3.7    4.9   73.9
#   sa     FSDP                     1.5   13.3    3.0    0.6   25.7    4.9   49.0
#   sa     FSDP + checkpointing     1.5   13.3    3.0    0.6    3.7    4.9   27.0
#   ha4_w  DDP                     12.3   24.6   24.6    6.2   26.4    4.9   99.1
#   ha4_w  DDP + checkpointing     12.3   24.6   24.6    6.2    3.8    4.9   76.5
#   ha4_w  FSDP                     1.5   13.9    3.1    0.6   26.4    4.9   50.4
#   ha4_w  FSDP + checkpointing     1.5   13.9    3.1    0.6    3.8    4.9   27.8
# LONG: days on one 8-GPU node. GPU-hours at 30% MFU, as every config here; HA's MFU is not measured.
# Budget: 59.20B tokens (56,460 iterations x 1,048,576), 18.33 GFLOPs/token, 1.09e+21 FLOPs, 1,017.9 GPU-hours on H100 at 30% MFU = 127.2 h on 8 x H100
# Grid budget: 2 runs (2 variants x 1 seed), 118.4B tokens, 2.41e+21 FLOPs, 2,256 GPU-hours on H100 at 30% MFU = 282.0 h on 8 GPUs
from config.scaling_s import *  # the study's recipe; only the size differs

_compare = dict(variants='sa,ha4_w', seeds='1', nproc=8, preset=[
    ['ha4_w', 'attn_layers=' + ','.join(['sa', 'sa', 'sa', 'ha'] * 9), 'ha_share_kv=False', 'ha_window1=512',
     'ha_window2=32'],
])
out_dir = 'out-scaling-xl'
wandb_run_name = 'scaling-xl'
parallel = 'fsdp'

n_layer = 36
n_head = 40
n_embd = 2560
batch_size = 8
gradient_accumulation_steps = 128  # 1,048,576 tokens per iteration (GPT-3 2.7B's batch), 16 micro-steps per GPU
max_iters = 56460                  # 20 x 2,960,120,320 parameters / 1,048,576
lr_decay_iters = 56460
warmup_iters = 2823
learning_rate = 1.6e-4             # GPT-3 2.7B's
min_lr = 1.6e-5
