# OpenWebText, the 3-layer 1024-context comparison [IA] reports: a hybrid layer of
# 2 SA + 2 HFA heads (n_head = 4, n_hfa_head = 2) against SA (reported ppl 27.75 vs 28.70,
# unverified; sizes unknown). Unlike the reported run, SA and the hybrid have the same
# head count here (4); compare.py --match params also equalises parameters.
#   torchrun --standalone --nproc_per_node=8 train.py config/owt_hybrid_3l.py                    # hybrid
#   torchrun --standalone --nproc_per_node=8 train.py config/owt_hybrid_3l.py --attention=sa \
#       --out_dir=out-owt-hybrid3l-sa                                                            # SA
#   python compare.py --config config/owt_hybrid_3l.py --variants sa,hybrid --nproc 8 --out out-owt-hybrid3l
out_dir = 'out-owt-hybrid3l'
wandb_run_name = 'hybrid3l'
dataset = 'openwebtext'
wandb_log = False
wandb_project = 'owt-attention'

# 12 x 40 x 1024 = 491,520 tokens per iteration over the 8 processes (nanoGPT's GPT-2 recipe);
# 10,000 iterations = 4.9B tokens, about half an epoch: a comparison budget, not a full run
batch_size = 12
block_size = 1024
gradient_accumulation_steps = 5 * 8
max_iters = 10000
lr_decay_iters = 10000
warmup_iters = 500
learning_rate = 6e-4
min_lr = 6e-5
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
eval_interval = 500
eval_iters = 200
log_interval = 10
always_save_checkpoint = True

# 3 layers, 4 heads of 128, 512 wide, context 1024
n_layer = 3
n_head = 4
n_embd = 512
dropout = 0.0
bias = False
attention = 'hfa_v1'
hfa_order = 2
n_hfa_head = 2      # 2 HFA heads + 2 SA heads in every layer
compile = True
