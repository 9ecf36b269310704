# nanoGPT's evaluation of the pretrained gpt2-large (774M parameters: n_layer=36, n_head=20, n_embd=1280)
# on OpenWebText's validation split, with nanoGPT's values.
#   python train.py config/eval_gpt2_large.py
batch_size = 8
eval_iters = 500  # more batches for a better estimate
eval_only = True
wandb_log = False
init_from = 'gpt2-large'
