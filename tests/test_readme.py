"""The docs' tables come from what they describe: the flag tables of docs/flags.md are
settings.py's (where every setting is documented once, and GPTConfig's fields are exactly the
documented model settings), and docs/layout.md names every script, library and tool in the
repository. The README is a guide that links to them: every relative link in it (and in docs/)
points at a file that exists, and every #anchor at a heading there."""

import dataclasses
import re
from pathlib import Path

from nanohfa import settings
from model import GPTConfig

ROOT = Path(__file__).resolve().parents[1]
FLAGS = (ROOT / 'docs' / 'flags.md').read_text()
LAYOUT = (ROOT / 'docs' / 'layout.md').read_text()


def generated(name):
    """docs/flags.md's text between <!-- settings: name --> and <!-- /settings -->."""
    m = re.search(rf'<!-- settings: {name} -->\n(.*?)\n<!-- /settings -->', FLAGS, re.S)
    assert m, f"docs/flags.md has no '<!-- settings: {name} -->' table"
    return m.group(1)


def test_attention_flags_are_settings_py():
    want = settings.markdown({'': {**settings.TRAIN['attention'], **settings.MODEL_ONLY['']}})
    assert generated('attention') == want, f"docs/flags.md's attention flags differ from settings.py; paste:\n{want}"


def test_interactions_flags_are_settings_py():
    want = settings.markdown(settings.INTERACTIONS)
    assert generated('interactions') == want, f"docs/flags.md's interactions.py flags differ from settings.py; paste:\n{want}"


def test_every_gptconfig_field_is_documented_in_settings_py():
    """A field added to GPTConfig without a meaning in settings.py fails here; the documented
    defaults are the model's (train.py's bias is off, as nanoGPT's train.py; GPT-2 has biases)."""
    fields = {f.name: f.default for f in dataclasses.fields(GPTConfig)}
    documented = {**settings.defaults({k: settings.TRAIN[k] for k in ('model', 'attention')}),
                  **settings.defaults(settings.MODEL_ONLY), 'block_size': settings.defaults(settings.TRAIN)['block_size']}
    assert set(fields) - {'vocab_size'} == set(documented)  # vocab_size: the data's, never a setting
    differ = {k for k in documented if fields[k] != documented[k]}
    assert differ == {'bias'}, differ


def test_layout_names_every_script_library_and_tool():
    """Every root .py file and every file in tools/ has a row (named in a row's first cell), and
    no row names a .py file that is not there (the attention_kernels/ table names its own files)."""
    layout = LAYOUT
    named = {n for cell in re.findall(r'^\| ([^|]*) \|', layout, re.M) for n in re.findall(r'`([^`]+)`', cell)}
    files = {p.name for p in ROOT.glob('*.py')} | {f'{d}/{p.name}' for d in ('tools', 'nanohfa') for p in (ROOT / d).iterdir()
                                                   if p.is_file() and not p.name.startswith(('.', '_'))}
    missing = sorted(files - named)
    assert not missing, f"docs/layout.md does not name {', '.join(missing)}"
    kernel_files = {p.name for p in (ROOT / 'attention_kernels').rglob('*.py')}
    gone = sorted(n for n in named if n.endswith('.py') and n not in files | kernel_files)
    assert not gone, f"docs/layout.md names files that do not exist: {', '.join(gone)}"


def anchor(heading):
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r'[^\w\- ]', '', heading.strip().lower()).replace(' ', '-')


def test_every_relative_link_of_the_readme_and_docs_resolves():
    pages = [ROOT / 'README.md', ROOT / 'RESULTS.md', *sorted((ROOT / 'docs').glob('*.md'))]
    broken = []
    for page in pages:
        text = re.sub(r'```.*?```', '', page.read_text(), flags=re.S)
        for target in re.findall(r'\]\(([^)\s]+)\)', text):
            if target.startswith(('http://', 'https://', 'mailto:')):
                continue
            path, _, frag = target.partition('#')
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f'{page.name}: {target} (no such file)')
            elif frag and dest.suffix == '.md' and frag not in {anchor(h) for h in re.findall(r'^#+ (.+)$', dest.read_text(), re.M)}:
                broken.append(f'{page.name}: {target} (no such heading)')
    assert not broken, broken


def test_the_readme_is_a_guide_of_about_250_lines():
    lines = (ROOT / 'README.md').read_text().count('\n')
    assert lines <= 300, f'README.md has {lines} lines: move reference material into docs/'


def test_every_example_command_of_a_scripts_help_stands_on_its_own_line():
    """--help prints the module docstring: an example command that runs into the next sentence
    (sample.py's `--meta=... The same seed gives ...`) reads as one command with stray arguments."""
    import ast
    joined = []
    for path in sorted(ROOT.glob('*.py')) + sorted((ROOT / 'tools').glob('*.py')):
        for line in (ast.get_docstring(ast.parse(path.read_text())) or '').splitlines():
            if re.match(r'\s*(python|torchrun|nice|make) ', line):
                command = re.sub(r'"[^"]*"|\'[^\']*\'', '', line.split('  #')[0])  # quoted text and comments aside
                if re.search(r'\S\s+(The|A|An|It|This|Each|Every)\s', command):
                    joined.append(f'{path.name}: {line.strip()}')
    assert not joined, joined


def test_the_quickstarts_time_is_the_same_everywhere():
    """config/quickstart.py, README.md and docs/training.md state the measured `make quickstart`."""
    for path in ('config/quickstart.py', 'README.md', 'docs/training.md'):
        text = ' '.join((ROOT / path).read_text().split())
        assert 'make quickstart' in text and '6 min 56 s' in text, path
        assert not re.search(r'about \d+ minutes(?! of (it )?training)', text[text.index('quickstart'):][:2000]), path
