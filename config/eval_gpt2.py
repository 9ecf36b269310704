# nanoGPT's evaluation of the pretrained gpt2 (124M parameters: n_layer=12, n_head=12, n_embd=768)
# on OpenWebText's validation split, with nanoGPT's values.
#   python train.py config/eval_gpt2.py
batch_size = 8
eval_iters = 500  # more batches for a better estimate
eval_only = True
wandb_log = False
init_from = 'gpt2'
