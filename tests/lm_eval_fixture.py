"""The local lm-eval tasks of tests/fixtures/lm_eval_tasks and a character tokenizer that covers their text."""
import json
from pathlib import Path

from nanohfa import tokenizer as tok

TASKS = Path(__file__).resolve().parent / 'fixtures' / 'lm_eval_tasks'
MC, TEXT, GEN = 'nanohfa_tiny_mc', 'nanohfa_tiny_text', 'nanohfa_tiny_gen'


def fixture_texts():
    rows = [json.loads(line) for n in ('tiny_mc', 'tiny_text', 'tiny_gen') for line in open(TASKS / f'{n}.json')]
    return [v if isinstance(v, str) else ''.join(v) for r in rows for v in r.values() if isinstance(v, (str, list))]


ENC = tok.CharTokenizer.from_text(fixture_texts() + ['\n'])
