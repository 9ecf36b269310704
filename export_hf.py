"""
Export a checkpoint as a Hugging Face folder, which transformers opens and the Hub takes as it is:

    python export_hf.py --out_dir=out-x --to=hf-x
    python export_hf.py --init_from=path/to/ckpt.pt --meta=data/shakespeare_char --to=hf-x   # nanoGPT's
    python export_hf.py --out_dir=out-sa --to=hf-sa --format=gpt2     # insist on a plain GPT2LMHeadModel

then, with no code of this project installed:

    AutoModelForCausalLM.from_pretrained("hf-x", trust_remote_code=True); AutoTokenizer.from_pretrained("hf-x")
    lm_eval --model hf --model_args pretrained=hf-x,trust_remote_code=True --tasks ...
    huggingface-cli upload USER/NAME hf-x          # or model.push_to_hub / tokenizer.push_to_hub

and back here: python train.py --init_from=hf-x ..., python sample.py --init_from=hf-x.

Every variant is written (safetensors weights, config.json, the tokenizer); a model that is not a
softmax-attention GPT of GPT-2's shape carries its code (model.py and the PyTorch attention
code, hf_folder.py says how). The folder is written beside --to and moved into place only once it
is complete and transformers has loaded it and given the checkpoint's logits (skip that with
--skip_check); an existing --to is replaced only with --overwrite. docs/huggingface.md.
"""

import argparse
import errno
import os
import shutil
import sys
from pathlib import Path

from nanohfa import errors
from nanohfa.errors import UserError


def parse_args(argv):
    p = errors.ArgumentParser(prog='export_hf.py', description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--out_dir', default='', help='a training run (its ckpt.pt)')
    p.add_argument('--init_from', default='', help='instead: a checkpoint file (ours or nanoGPT\'s)')
    p.add_argument('--to', required=True, help='the folder to write (it must not exist, unless --overwrite)')
    p.add_argument('--format', choices=('auto', 'gpt2', 'nanohfa'), default='auto',
                   help="gpt2: transformers' GPT2LMHeadModel (softmax attention of GPT-2's shape only); nanohfa: "
                        "the model's own code in the folder (trust_remote_code); auto: gpt2 where it fits")
    p.add_argument('--meta', default='', help="a nanoGPT checkpoint's tokenizer: its dataset folder or meta.pkl")
    p.add_argument('--overwrite', action='store_true', help='replace --to if it holds an earlier export')
    p.add_argument('--skip_check', action='store_true',
                   help="do not load the written folder with transformers to compare its logits with the checkpoint's")
    args = p.parse_args(argv)
    if bool(args.out_dir) == bool(args.init_from):
        p.error('give the checkpoint: --out_dir=RUN or --init_from=ckpt.pt (one of them)')
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from nanohfa import checkpoint
    from nanohfa import data
    from nanohfa import hf_folder
    from safetensors import SafetensorError
    path = Path(args.out_dir) / 'ckpt.pt' if args.out_dir else Path(args.init_from)
    to = Path(args.to)
    if to.exists() and not (args.overwrite and hf_folder.config_of(to) is not None):
        raise UserError(f"--to={to} already exists" + (
            "; --overwrite replaces only a folder export_hf.py wrote (it has a config.json with `nanohfa`): give "
            "another --to" if args.overwrite else "; give another --to, or --overwrite to replace an earlier export"))
    ckpt = checkpoint.load_checkpoint(path, "train first (python train.py ...), or give --out_dir / --init_from")
    model = checkpoint.model_from_checkpoint(ckpt, path, kernel='torch')  # PyTorch: the folder's own kernels
    record = data.tokenizer_record(checkpoint.checkpoint_meta(ckpt, path, args.meta))
    source = {'checkpoint': str(path), 'iter_num': ckpt.get('iter_num', 0), 'dataset': ckpt.get('dataset'),
              'best_val_loss': float(ckpt.get('best_val_loss', 1e9))}
    # written in a folder of its own beside --to, under --to's name (transformers names the code's
    # module after it), and moved into place only when complete and checked
    work = to.parent / f'.{to.name}.export-{os.getpid()}'
    new = work / to.name
    try:
        fmt = hf_folder.write(model.eval(), record, new, source, args.format,
                              kernel=ckpt['model_args'].get('kernel', 'auto'))
        worst = None if args.skip_check else hf_folder.check(new, model)
        old = work / 'replaced'
        if to.exists() and args.overwrite:  # the old export goes only once the new one is complete
            os.rename(to, old)
        try:
            os.rename(new, to)
        except OSError:
            if old.exists():
                os.rename(old, to)
            raise
    except (OSError, SafetensorError) as e:  # safetensors' own error for a failed write of the weights
        if getattr(e, 'errno', None) in (errno.EEXIST, errno.ENOTEMPTY) and new.exists() and to.exists():
            raise UserError(f"--to={to} was created by another process while this export ran; nothing was "
                            f"changed there: give another --to, or --overwrite")
        why = getattr(e, 'strerror', None) or str(e).split('I/O error: ')[-1]
        raise UserError(f"could not write {to} ({why}); nothing was changed there: free some space or give "
                        f"another --to")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    code = "the model's code carried in it: trust_remote_code=True" if fmt == 'nanohfa' else \
        "transformers' GPT2LMHeadModel: no code carried"
    print(f"wrote {to} ({code}): {model.get_num_params(False):,} parameters, {record.get('tokenizer')} tokenizer "
          f"of {record['vocab_size']} tokens")
    if worst is not None:
        print(f"checked: transformers' AutoModelForCausalLM gives the checkpoint's logits (largest difference "
              f"{worst:.1e} of the largest logit)")


if __name__ == '__main__':
    main()
