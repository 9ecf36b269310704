# HyperFeatureAttention hfa_v2 ([IA] Def E.2): as hfa_v1 but the value is also a Hadamard
# product, V = (X W_V1) * (X W_V2). GPT-2 small on OpenWebText, the sa recipe.
#   torchrun --standalone --nproc_per_node=8 train.py config/hfa_v2.py
# 3A = 6 projection streams per head (+3 x 768 x 768 parameters per layer vs sa).
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
out_dir = 'out-hfa_v2'
wandb_run_name = 'hfa_v2'
attention = 'hfa_v2'
hfa_order = 2
n_hfa_head = -1
head_dim = 0
