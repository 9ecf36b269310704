# The quickstart: a small character-level GPT on the embedded Shakespeare corpus,
# a few minutes on 2 CPU cores (prepare it with `python prepare_shakespeare.py`).
out_dir = 'out-quickstart'
dataset = 'shakespeare_char'
device = 'cpu'
eval_interval = 250
eval_iters = 20
log_interval = 100
always_save_checkpoint = False

gradient_accumulation_steps = 1
batch_size = 32
block_size = 128

n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0
bias = False
attention = 'sa'

learning_rate = 2e-3
max_iters = 1500
lr_decay_iters = 1500
min_lr = 2e-4
warmup_iters = 50
beta2 = 0.99
