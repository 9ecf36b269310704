# Baseline: GPT-2 small (124M) with softmax self-attention on OpenWebText, nanoGPT's recipe
# ([IA] Sec. 7.2 "SA" row, reported val ppl 62.28 at an unknown size/budget).
#   torchrun --standalone --nproc_per_node=8 train.py config/sa.py
# 12 x 1024 x 40 = 491,520 tokens per iteration; 600k iterations ~ 295B tokens.
out_dir = 'out-sa'
wandb_run_name = 'sa'
dataset = 'openwebtext'
eval_interval = 1000
eval_iters = 200
log_interval = 10

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
max_iters = 600000
lr_decay_iters = 600000
min_lr = 6e-5
warmup_iters = 2000
weight_decay = 1e-1
