# nanoGPT's evaluation of the pretrained gpt2-medium (350M parameters: n_layer=24, n_head=16, n_embd=1024)
# on OpenWebText's validation split, with nanoGPT's values.
#   python train.py config/eval_gpt2_medium.py
batch_size = 8
eval_iters = 500  # more batches for a better estimate
eval_only = True
wandb_log = False
init_from = 'gpt2-medium'
