# CPU companion of config/hfa.py: the cpu_sa model with hfa_v1 (A = 2, dh = 32).
#   python train.py config/cpu_hfa.py
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
out_dir = 'out-cpu-hfa'
attention = 'hfa_v1'
hfa_order = 2
