# Linear self-attention ([IA] Eq. 1: the softmax removed) at GPT-2 small on OpenWebText.
# Same recipe as config/sa.py; only the attention changes. Parameters equal to sa.
#   torchrun --standalone --nproc_per_node=8 train.py config/linear.py
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

learning_rate = 6e-4
max_iters = 600000
lr_decay_iters = 600000
min_lr = 6e-5
warmup_iters = 2000
weight_decay = 1e-1

# this variant
out_dir = 'out-linear'
wandb_run_name = 'linear'
attention = 'linear'
# Our choice (SPEC 1.2): divide by the number of visible keys, i + 1. Unnormalised sums over
# 1024 keys grow with position; set False for the literal [IA] Eq. 1 form.
linear_norm = True
