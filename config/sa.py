# Baseline: GPT-2 small (124M) with softmax self-attention on OpenWebText, nanoGPT's recipe at a
# budget that fits a day on one 8-GPU node ([IA] Sec. 7.2 "SA" row, reported val ppl 62.28 at an
# unknown size/budget). nanoGPT's full 600k-iteration run: config/sa_nanogpt.py.
#   torchrun --standalone --nproc_per_node=8 train.py config/sa.py
# 12 x 1024 x 40 = 491,520 tokens per iteration; 50,000 iterations = 24.6B tokens (~10x the
# Chinchilla-optimal count for 124M parameters: a comparison budget, not a full run).
# Budget: 24.58B tokens (50,000 iterations x 491,520), 0.80 GFLOPs/token, 1.97e+19 FLOPs, 18.4 GPU-hours on H100 at 30% MFU = 2.3 h on 8 x H100
# (Budget lines: tools/budgets.py, checked by tests/test_budgets.py. 30% MFU is what nanoGPT's own
# GPT-2 run implies, 295B tokens in ~4 days on 8 x A100 per its README; ours on a GPU is not yet
# measured, nor are the HA/HFA kernels', which may be slower.)
out_dir = 'out-sa'
wandb_run_name = 'sa'
dataset = 'openwebtext'
eval_interval = 1000
eval_iters = 200
log_interval = 10
compile = True

batch_size = 12
block_size = 1024
gradient_accumulation_steps = 5 * 8

n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0
bias = False
attention = 'sa'

learning_rate = 6e-4
max_iters = 50000
lr_decay_iters = 50000
min_lr = 6e-5
warmup_iters = 2000
weight_decay = 1e-1
