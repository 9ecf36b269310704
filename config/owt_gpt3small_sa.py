# OpenWebText, GPT-3-small-like model: softmax self-attention, the baseline.
#   torchrun --standalone --nproc_per_node=8 train.py config/owt_gpt3small_sa.py
# Budget: 4.92B tokens (10,000 iterations x 491,520), 0.80 GFLOPs/token, 3.95e+18 FLOPs, 3.7 GPU-hours on H100 at 30% MFU = 28 min on 8 x H100
# Several seeds and the table: python compare.py --config config/owt_gpt3small_sa.py \
#   --variants sa,hfa,hfa_v2 --gpus 0-7 --out out-owt-gpt3small   (see RESULTS.md)
out_dir = 'out-owt-gpt3small-sa'
wandb_run_name = 'gpt3small-sa'
dataset = 'openwebtext'
wandb_log = False
wandb_project = 'owt-attention'

# 12 x 40 x 1024 = 491,520 tokens per iteration over the 8 processes (nanoGPT's GPT-2 recipe);
# 10,000 iterations = 4.9B tokens, about half an epoch: a comparison budget, not a full run
batch_size = 12
block_size = 1024
gradient_accumulation_steps = 5 * 8
max_iters = 10000
lr_decay_iters = 10000
warmup_iters = 500
learning_rate = 6e-4
min_lr = 6e-5
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
eval_interval = 500
eval_iters = 200
log_interval = 10
always_save_checkpoint = True

# GPT-3 small shape (12 layers, 768 wide, 12 heads of 64), context 1024
n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0
bias = False
attention = 'sa'
compile = True
