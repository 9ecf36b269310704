# nanoGPT's evaluation of the pretrained gpt2-xl (1558M parameters: n_layer=48, n_head=25, n_embd=1600)
# on OpenWebText's validation split, with nanoGPT's values.
#   python train.py config/eval_gpt2_xl.py
batch_size = 8
eval_iters = 500  # more batches for a better estimate
eval_only = True
wandb_log = False
init_from = 'gpt2-xl'
