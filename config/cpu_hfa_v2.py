# CPU companion of config/hfa_v2.py: the cpu_sa model with hfa_v2 (Hadamard values, A = 2).
#   python train.py config/cpu_hfa_v2.py
from config.cpu_sa import *  # the shared recipe; only what follows differs

out_dir = 'out-cpu-hfa_v2'
attention = 'hfa_v2'
hfa_order = 2
