# The CPU comparison grids (tools/cpu_grids.py runs them through compare.py; RESULTS.md):
# tiny character-level GPTs on Shakespeare, ~0.23M parameters, context 64,
# 1000 iterations x 32 x 64 = 2,048,000 tokens per run (0.44 epochs of the training split).
#   python compare.py --config config/compare_cpu.py --out out-compare-cpu --jobs 2 --threads 1
# Every variant trains on the same windows in the same order (per seed) and is evaluated on
# the same fixed 20 x 32 windows of the validation split. HA is windowed by default here
# (2-simplicial style, j1 in the last 16 positions, j2 in the last 8); the windows touch only
# HA layers (attn_window windows sa, linear and hfa heads).
dataset = 'shakespeare_char'
device = 'cpu'
eval_interval = 50
eval_iters = 20
log_interval = 50
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
ha_form = 'blockwise'  # the form the committed grids trained with: their runs rerun bit-identical (tools/rerun.py)

learning_rate = 2e-3
max_iters = 1000
lr_decay_iters = 1000
min_lr = 2e-4
warmup_iters = 20
beta2 = 0.99
