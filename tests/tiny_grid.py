"""A tiny character corpus and config file for tests that run whole grids (compare.py, SLURM)."""
import json

import numpy as np


def write(root, config_text):
    """root/data: 4,000 training and 1,000 validation tokens of a 20-character vocabulary
    (seeded), with its meta.json; root/tiny.py: the config. Returns root."""
    d = root / 'data'
    d.mkdir()
    rng = np.random.default_rng(0)
    rng.integers(0, 20, 4000, dtype=np.uint16).tofile(d / 'train.bin')
    rng.integers(0, 20, 1000, dtype=np.uint16).tofile(d / 'val.bin')
    (d / 'meta.json').write_text(json.dumps({'tokenizer': 'char', 'vocab_size': 20, 'itos': [chr(97 + i) for i in range(20)]}))
    (root / 'tiny.py').write_text(config_text)
    return root
