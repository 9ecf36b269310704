# CPU companion of config/hfa.py: the cpu_sa model with hfa_v1 (A = 2, dh = 32).
#   python train.py config/cpu_hfa.py
from config.cpu_sa import *  # the shared recipe; only what follows differs

out_dir = 'out-cpu-hfa'
attention = 'hfa_v1'
hfa_order = 2
