# OpenWebText, the 3-layer 1024-context comparison [IA] reports: a hybrid layer of
# 2 SA + 2 HFA heads (n_head = 4, n_hfa_head = 2) against SA (reported ppl 27.75 vs 28.70,
# unverified; sizes unknown). Unlike the reported run, SA and the hybrid have the same
# head count here (4); compare.py --match params also equalises parameters.
#   torchrun --standalone --nproc_per_node=8 train.py config/owt_hybrid_3l.py                    # hybrid
#   torchrun --standalone --nproc_per_node=8 train.py config/owt_hybrid_3l.py --attention=sa \
#       --out_dir=out-owt-hybrid3l-sa                                                            # SA
#   python compare.py --config config/owt_hybrid_3l.py --variants sa,hybrid --gpus 0-7 --out out-owt-hybrid3l
# Budget: 4.92B tokens (10,000 iterations x 491,520), 0.23 GFLOPs/token, 1.13e+18 FLOPs, 1.1 GPU-hours on H100 at 30% MFU = 8 min on 8 x H100
from config.owt_gpt3small_sa import *  # the shared recipe; only what follows differs

out_dir = 'out-owt-hybrid3l'
wandb_run_name = 'hybrid3l'

# 3 layers, 4 heads of 128, 512 wide, context 1024
n_layer = 3
n_head = 4
n_embd = 512
attention = 'hfa_v1'
hfa_order = 2
n_hfa_head = 2      # 2 HFA heads + 2 SA heads in every layer
compile = True
