"""The README's tables come from what they describe: its flag tables are settings.py's (where
every setting is documented once, and GPTConfig's fields are exactly the documented model
settings), and its layout tables name every script, library and tool in the repository."""

import dataclasses
import re
from pathlib import Path

import settings
from model import GPTConfig

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / 'README.md').read_text()


def generated(name):
    """The README's text between <!-- settings: name --> and <!-- /settings -->."""
    m = re.search(rf'<!-- settings: {name} -->\n(.*?)\n<!-- /settings -->', README, re.S)
    assert m, f"README.md has no '<!-- settings: {name} -->' table"
    return m.group(1)


def test_readme_attention_flags_are_settings_py():
    want = settings.markdown({'': {**settings.TRAIN['attention'], **settings.MODEL_ONLY['']}})
    assert generated('attention') == want, f"README.md's attention flags differ from settings.py; paste:\n{want}"


def test_readme_interactions_flags_are_settings_py():
    want = settings.markdown(settings.INTERACTIONS)
    assert generated('interactions') == want, f"README.md's interactions.py flags differ from settings.py; paste:\n{want}"


def test_every_gptconfig_field_is_documented_in_settings_py():
    """A field added to GPTConfig without a meaning in settings.py fails here; the documented
    defaults are the model's (train.py's bias is off, as nanoGPT's train.py; GPT-2 has biases)."""
    fields = {f.name: f.default for f in dataclasses.fields(GPTConfig)}
    documented = {**settings.defaults({k: settings.TRAIN[k] for k in ('model', 'attention')}),
                  **settings.defaults(settings.MODEL_ONLY), 'block_size': settings.defaults(settings.TRAIN)['block_size']}
    assert set(fields) - {'vocab_size'} == set(documented)  # vocab_size: the data's, never a setting
    differ = {k for k in documented if fields[k] != documented[k]}
    assert differ == {'bias'}, differ


def test_readme_layout_names_every_script_library_and_tool():
    """Every root .py file and every file in tools/ has a row (named in a row's first cell), and
    no row names a .py file that is not there (the attention_kernels/ table names its own files)."""
    layout = README[README.index('\n## Layout\n'):]
    named = {n for cell in re.findall(r'^\| ([^|]*) \|', layout, re.M) for n in re.findall(r'`([^`]+)`', cell)}
    files = {p.name for p in ROOT.glob('*.py')} | {f'tools/{p.name}' for p in (ROOT / 'tools').iterdir()
                                                   if p.is_file() and not p.name.startswith(('.', '_'))}
    missing = sorted(files - named)
    assert not missing, f"README.md's Layout does not name {', '.join(missing)}"
    kernel_files = {p.name for p in (ROOT / 'attention_kernels').rglob('*.py')}
    gone = sorted(n for n in named if n.endswith('.py') and n not in files | kernel_files)
    assert not gone, f"README.md's Layout names files that do not exist: {', '.join(gone)}"
