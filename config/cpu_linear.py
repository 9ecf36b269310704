# CPU companion of config/linear.py: the cpu_sa model with linear attention ([IA] Eq. 1).
#   python train.py config/cpu_linear.py
from config.cpu_sa import *  # the shared recipe; only what follows differs

out_dir = 'out-cpu-linear'
attention = 'linear'
linear_norm = True  # our choice, see config/linear.py
