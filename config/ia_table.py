# [IA]'s OpenWebText table (Sec. 7.2), over 3 seeds: SA, HFA of order 2 and 4, HA (order 3) with and
# without weight sharing, at GPT-3-small shape, parameter-matched. One command on an 8-GPU node:
#   python compare.py --config config/ia_table.py --gpus 0-7 --out out-ia-table
# which is, from the _compare defaults below:
#   python compare.py --config config/ia_table.py --variants sa,hfa2,hfa4,ha_share,ha_noshare \
#       --seeds 3 --match params --match_by head_dim --match_multiple 8 --gpus 0-7 --out out-ia-table
# (add --dry_run to see every run, its command and its budget first).
# Reported by [IA] (through secondary summaries, unverified): val ppl SA 62.28, HFA 60.22, HA 51.26,
# HA without weight sharing 48.50, in a "GPT3-small setting", HFA of order 4, HA's cost brought to
# O(L R^2) by weight sharing and a restricted range R. Sizes, steps and tokenizer are not known.
# - Shape: GPT-3 small (Brown et al. 2020): 12 layers, width 768, 12 heads of 64, GPT-2 BPE.
#   Context 1024, not GPT-3's 2048: nanoGPT's OpenWebText setting, where users know SA's numbers,
#   and the context of [IA]'s table is not known.
# - HFA: hfa4 reads "order 4" as A = 4 score factors per head (hfa_order = 4). That is our reading:
#   the summary does not define it. hfa2 is A = 2, the form of config/hfa.py.
# - HA: order 3 in every layer (a like-for-like replacement, as SA and HFA are), each of the two key
#   slots restricted to the last R = 64 positions (ha_window1 = ha_window2 = 64): the O(L R^2)
#   of the summary, 4,096 key pairs per query against SA's 1,024 keys at most.
# - Parameter matching: hfa2, hfa4 and ha_noshare carry extra projections. --match params
#   --match_by head_dim shrinks their head width (a multiple of 8, for the GPU kernels) to SA's
#   parameter count, keeping depth, width and head count; ha_share already has SA's count.
# - Budget per run: the owt_gpt3small recipe, 10,000 iterations x 491,520 tokens = 4.9B tokens,
#   one GPU per run (8 runs at a time), every run on the same tokens and evaluation windows.
# Budget: 4.92B tokens (10,000 iterations x 491,520), 0.80 GFLOPs/token, 3.95e+18 FLOPs, 3.7 GPU-hours on H100 at 30% MFU = 28 min on 8 x H100
# Grid budget: 15 runs (5 variants x 3 seeds), 73.7B tokens, 6.75e+19 FLOPs, 63 GPU-hours on H100 at 30% MFU = 9.1 h on 8 GPUs
from config.owt_gpt3small_sa import *  # the shared recipe; only what follows differs

_compare = dict(variants='sa,hfa2,hfa4,ha_share,ha_noshare', seeds='3',
                match='params', match_by='head_dim', match_multiple=8)
out_dir = 'out-ia-table'
wandb_run_name = 'ia-table'
ha_order = 3
ha_window1 = 64
ha_window2 = 64
compile = True
