# nanoGPT's finetuning recipe, with nanoGPT's values: GPT-2 XL's weights (init_from='gpt2-xl',
# softmax attention) finetuned on the embedded Shakespeare corpus in GPT-2 tokens.
#   python prepare_shakespeare.py --only=gpt2 && python train.py config/finetune_shakespeare.py
# 1 x 32 x 1024 = 32,768 tokens per iteration; our corpus has 1.44M training tokens (nanoGPT's
# tiny Shakespeare has 0.30M), so 20 iterations see under half of it once.
import time

out_dir = 'out-shakespeare'
eval_interval = 5
eval_iters = 40
wandb_log = False
wandb_project = 'shakespeare'
wandb_run_name = 'ft-' + str(time.time())

dataset = 'shakespeare'
init_from = 'gpt2-xl'

always_save_checkpoint = False  # save only when the validation loss improves

batch_size = 1
gradient_accumulation_steps = 32
max_iters = 20

learning_rate = 3e-5  # constant
decay_lr = False
