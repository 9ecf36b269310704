# CPU companion of config/hfa_v2.py: the cpu_sa model with hfa_v2 (Hadamard values, A = 2).
#   python train.py config/cpu_hfa_v2.py
dataset = 'shakespeare_char'
device = 'cpu'
compile = False
eval_interval = 100
eval_iters = 20
log_interval = 25
always_save_checkpoint = False

gradient_accumulation_steps = 1
batch_size = 32
block_size = 128

n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0
bias = False

learning_rate = 2e-3
max_iters = 600
lr_decay_iters = 600
min_lr = 2e-4
warmup_iters = 50
beta2 = 0.99

# this variant
out_dir = 'out-cpu-hfa_v2'
attention = 'hfa_v2'
hfa_order = 2
