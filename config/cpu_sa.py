# CPU companion of config/sa.py: a ~0.8M-parameter character GPT on Shakespeare, softmax
# attention; 600 iterations x 32 x 128 tokens, a few minutes on 2 idle CPU cores (the README's
# quickstart trains the same model for 1500 iterations, with its measured losses).
#   python prepare_shakespeare.py && python train.py config/cpu_sa.py
out_dir = 'out-cpu-sa'
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
attention = 'sa'

learning_rate = 2e-3
max_iters = 600
lr_decay_iters = 600
min_lr = 2e-4
warmup_iters = 50
beta2 = 0.99
