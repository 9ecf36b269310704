"""
Evaluate a checkpoint with EleutherAI's lm-evaluation-harness: any task it has, any attention
variant, the checkpoint as it is (lm_eval_model.py: how each request is scored).

    python eval.py --out_dir=out-x --tasks=lambada_openai,hellaswag,wikitext
    python eval.py --out_dir=out-x --tasks=nanohfa_tiny_mc,nanohfa_tiny_text --include_path=tests/fixtures/lm_eval_tasks
    python eval.py --init_from=path/to/ckpt.pt --meta=data/shakespeare_char --tasks=... --limit=100
    python eval.py --init_from=gpt2 --tasks=wikitext      # GPT-2's weights (Hub cache, or a save_pretrained folder)
    torchrun --standalone --nproc_per_node=8 eval.py --out_dir=out-x --tasks=hellaswag   # the documents split by rank

Writes lm-eval's results JSON beside the checkpoint (OUT_DIR/lm_eval_results.json; for a
folder, FOLDER.lm_eval_results.json beside it, never into it), merged task by task with what an
earlier evaluation of the same weights saved there (other weights' results are kept and the
new ones dated, lm_eval_results_<date>.json), or where
--output_path says, as lm-eval's own CLI: a folder (FOLDER/<model>/results_<date>.json) or a
path ending in .json (<name>_<date>.json); and prints its table. Under torchrun every process
scores its share of the documents and the first writes the results. Offline (no Hugging Face
Hub) a task reads its data from the local datasets cache (HF_DATASETS_CACHE, filled on a
connected machine), or comes from a folder of task YAMLs over local files (--include_path, as
lm-eval's own CLI): docs/evaluation.md.
"""

import argparse
import difflib
import sys
import time
from pathlib import Path

from nanohfa import errors


def parse_args(argv):
    p = errors.ArgumentParser(prog='eval.py', description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--out_dir', default='', help='a training run (its ckpt.pt)')
    p.add_argument('--init_from', default='',
                   help="instead: a checkpoint file, or GPT-2's weights (gpt2*, or a folder)")
    p.add_argument('--tasks', default='', help='comma-separated lm-eval task, group or tag names (required)')
    p.add_argument('--include_path', default='', help='a folder of extra task YAMLs')
    p.add_argument('--limit', type=float, default=None, help='documents per task (a fraction if < 1)')
    p.add_argument('--num_fewshot', type=int, default=None, help="few-shot examples (default: the task's)")
    p.add_argument('--batch_size', type=int, default=16, help='sequences per forward pass (and per generation batch)')
    p.add_argument('--device', default='auto', help='auto, cpu, cuda, cuda:N, mps (under torchrun: each its own GPU)')
    p.add_argument('--dtype', default='auto',
                   help="auto (bfloat16 on CUDA that has it, else float32), float32, bfloat16, float16")
    p.add_argument('--kernel', default='', help="the attention kernel (default: the checkpoint's)")
    p.add_argument('--meta', default='', help="a nanoGPT checkpoint's tokenizer: its dataset folder or meta.pkl")
    p.add_argument('--max_gen_toks', type=int, default=256,
                   help="generation tasks: tokens at most (unless the task says)")
    p.add_argument('--unknown_chars', choices=('error', 'drop'), default='error',
                   help='character models: a character outside their vocabulary stops the run, or is dropped '
                        'from prompts and contexts (a scored text holding one is refused)')
    p.add_argument('--output_path', default='',
                   help='a folder, or a .json path, as lm-eval\'s CLI (default: OUT_DIR/lm_eval_results.json)')
    args, unknown = p.parse_known_args(argv)
    if unknown:  # before a missing --tasks: a misspelt flag is the mistake to name
        flags = [a.option_strings[0] for a in p._actions if a.option_strings]
        near = {u: difflib.get_close_matches(u.split('=')[0], flags, n=1) for u in unknown}
        p.error(f"unrecognized argument(s) {' '.join(unknown)}"
                + ''.join(f" ({u.split('=')[0]}: did you mean {m[0]}?)" for u, m in near.items() if m))
    if not args.tasks:
        p.error('--tasks is required: comma-separated lm-eval task, group or tag names')
    if bool(args.out_dir) == bool(args.init_from):
        p.error('give the checkpoint: --out_dir=RUN or --init_from=ckpt.pt|gpt2|FOLDER (one of them)')
    if args.out_dir and not Path(args.out_dir).is_dir():
        raise errors.UserError(f"--out_dir {args.out_dir}: no such folder; give the out_dir of a training run (it "
                               f"holds ckpt.pt), or --init_from=FILE for a checkpoint file")
    if args.limit is not None and args.limit <= 0:
        p.error('--limit must be > 0')
    if args.limit is not None and args.limit >= 1:
        args.limit = int(args.limit)
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from nanohfa import lm_eval_tasks  # lm-eval and datasets take seconds to import: after the arguments are checked
    from lm_eval.utils import make_table
    t0 = time.time()
    results = lm_eval_tasks.evaluate(args.out_dir or args.init_from, args.tasks, args.include_path, args.limit,
                                     args.num_fewshot, batch_size=args.batch_size, device=args.device,
                                     dtype=args.dtype, kernel=args.kernel, meta=args.meta,
                                     max_gen_toks=args.max_gen_toks, unknown_chars=args.unknown_chars)
    if results is None:  # another process of torchrun: the first writes
        return
    ckpt = Path(results['nanohfa']['checkpoint'])
    if args.output_path:
        out = lm_eval_tasks.save(results, args.output_path, str(ckpt))
    else:
        out, results = lm_eval_tasks.default_results(results, ckpt)  # merged by task, never into an export folder
        lm_eval_tasks.write_results(results, out)
    print(make_table(results))
    if 'groups' in results:
        print(make_table(results, 'groups'))
    print(f"wrote {out} ({time.time() - t0:.1f} s)")


if __name__ == '__main__':
    main()
