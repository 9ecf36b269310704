# The quickstart: the 0.8M-parameter character GPT of config/cpu_sa.py on the embedded
# Shakespeare corpus, trained for 1500 iterations (6.1M tokens: about 6 minutes of training on 2 CPU
# cores; `make quickstart`, data preparation included, took 6 min 56 s: docs/training.md).
# Prepare the data first with `python prepare_shakespeare.py` (make quickstart does).
from config.cpu_sa import *  # the model, data and optimiser; only the schedule differs

out_dir = 'out-quickstart'
eval_interval = 250
log_interval = 100
max_iters = 1500
lr_decay_iters = 1500
