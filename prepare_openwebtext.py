"""
Prepare a corpus as uint16 token files for train.py: data/<name>/{train,val}.bin + meta.json,
or shards of 100M tokens (train_000000.bin, ..., val_000000.bin) for OpenWebText and corpora too
big for one: a run that is stopped resumes at the next shard when started again.

    python prepare_openwebtext.py                         # OpenWebText from the Hub (needs network), as shards
    python prepare_openwebtext.py --hf_id=HuggingFaceFW/fineweb --hf_config=sample-10BT   # FineWeb's 10B sample
    python prepare_openwebtext.py --hf_revision=refs/convert/parquet   # the Hub's parquet conversion
    python prepare_openwebtext.py --source=corpus.txt --name=mine
    python prepare_openwebtext.py --source=docs/ --tokenizer=char --name=mine_char
    python prepare_openwebtext.py --source=shard.jsonl    # or .parquet: a 'text' column

OpenWebText: 8,013,769 documents, ~9.0B GPT-2 tokens train / ~4.4M val with the 0.0005
split (nanoGPT's numbers). Its old script-based loader broke with datasets >= 4; the set
lives on the Hub as Skylion007/openwebtext (--hf_id). If a Hub id turns out to be a loading
script, its parquet conversion (--hf_revision=refs/convert/parquet) holds the same data as
plain files. Offline, the script says so in a second and names the local options.
"""

import os

from nanohfa.errors import ArgumentParser  # one-line messages for bad input, the command line's too
from nanohfa import data
from nanohfa import shards


def main():
    p = ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--source', default='openwebtext',
                   help="'openwebtext' (Hub), 'shakespeare' or 'milton' (embedded), a text file, a folder of .txt, .jsonl or .parquet")
    p.add_argument('--name', default=None, help='output folder under --root (default: from the source)')
    p.add_argument('--root', default=str(data.DATA), help='where dataset folders go (default: data/ beside this script)')
    p.add_argument('--tokenizer', default='gpt2', choices=['gpt2', 'char'])
    p.add_argument('--val_fraction', type=float, default=None, help='documents held out (default 0.0005 OWT, else 0.1)')
    p.add_argument('--hf_id', default='Skylion007/openwebtext', help='Hub dataset id (or a local dataset folder) for --source=openwebtext')
    p.add_argument('--hf_revision', default=None, help='Hub branch, tag or commit, e.g. refs/convert/parquet')
    p.add_argument('--hf_config', default=None, help='Hub dataset configuration name, if it has several')
    p.add_argument('--shard_tokens', type=int, default=None,
                   help='tokens per shard, at most 2,147,483,647 (the header holds an int32); 0: one train.bin and '
                        'val.bin (default: 100M for the Hub or a local source of more bytes than that, else 0)')
    p.add_argument('--num_proc', type=int, default=max(1, (os.cpu_count() or 2) // 2))
    p.add_argument('--sample_by', choices=['line', 'paragraph', 'document'], default=None,
                   help='how a text file splits into documents (default: paragraph; a folder: document per file)')
    a = p.parse_args()
    if a.shard_tokens is not None and not 0 <= a.shard_tokens <= shards.MAX_SHARD_TOKENS:
        p.error(f"--shard_tokens={a.shard_tokens:,} is out of range: a shard's header counts its tokens in an int32; "
                f"give 1 to {shards.MAX_SHARD_TOKENS:,} tokens per shard, or 0 for single files")
    hub_name = a.hf_id.rstrip('/').split('/')[-1].lower() + (f'_{a.hf_config}' if a.hf_config else '')
    name = a.name or ('openwebtext' if a.source == 'openwebtext' and a.hf_id == p.get_default('hf_id') else
                      hub_name if a.source == 'openwebtext' else a.source if a.source in ('shakespeare', 'milton')
                      else os.path.splitext(os.path.basename(a.source.rstrip('/')))[0])
    if a.tokenizer == 'char' and not a.name:
        name += '_char'
    val_fraction = a.val_fraction if a.val_fraction is not None else (0.0005 if a.source == 'openwebtext' else 0.1)
    meta = os.path.join(a.root, name, 'meta.json')
    stamp = lambda: os.stat(meta).st_mtime_ns if os.path.exists(meta) else None
    before = stamp()
    out = data.prepare(a.source, name, a.tokenizer, val_fraction, a.num_proc, a.hf_id, a.sample_by,
                       root=a.root, hf_revision=a.hf_revision, hf_config=a.hf_config, shard_tokens=a.shard_tokens)
    print(f"{'wrote ' * (stamp() != before)}{out}:\n{data.summary(out)}")  # unchanged: already prepared


if __name__ == '__main__':
    main()
