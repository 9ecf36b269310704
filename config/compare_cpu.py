# The CPU comparison grid for compare.py: tiny character-level GPTs on Shakespeare,
# ~0.23M parameters, context 64, 200 iterations x 32 x 64 = 409,600 tokens per run.
#   python compare.py --config config/compare_cpu.py --out out-compare-cpu --jobs 2 --threads 1
# Every variant trains on exactly the same tokens (same iterations, batch and block) and
# is evaluated on the same fixed windows. HA is windowed (2-simplicial style, j1 in the
# last 16 positions, j2 in the last 8) so that it fits the CPU budget; the windows touch
# only HA layers.
dataset = 'shakespeare_char'
device = 'cpu'
eval_interval = 40
eval_iters = 10
log_interval = 40
always_save_checkpoint = True

gradient_accumulation_steps = 1
batch_size = 32
block_size = 64

n_layer = 2
n_head = 4
n_embd = 96
dropout = 0.0
bias = False
ha_window1 = 16
ha_window2 = 8

learning_rate = 2e-3
max_iters = 200
lr_decay_iters = 200
min_lr = 2e-4
warmup_iters = 20
beta2 = 0.99
