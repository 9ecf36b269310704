"""docs/interactions.md and docs/random_features.md say what the committed results say.

Each experiment's default run (and the two extra runs the docs quote: Adam on the colliding
agents, the d = 8 random-feature probe) is committed as results/<name>/results.json. Here:
- each file comes from the command its doc shows (results.json records its command line);
- every table the experiment's `tables()` generates from the file appears in the doc verbatim;
- the sentences that quote a result quote the number the file holds (PROSE: each sentence is
  rebuilt from the files and must appear in the doc); and, as a coarser net for numbers added
  later, every decimal number in the docs' prose is a number of those files (in one of the
  formats the docs use) or a number listed below with its reason;
- every figure the docs show was drawn by the run whose numbers are committed (savefig writes
  the command and run id into the PNG).
"""

import json
import math
import re
import sys
from pathlib import Path

import pytest

from experiments import beyond_pairwise, colliding_agents, random_features, theory_limits
from experiments.common import png_source

ROOT = Path(__file__).resolve().parents[1]
INTERACTIONS, RF = 'docs/interactions.md', 'docs/random_features.md'

# (doc, results folder, module, the generated blocks the doc shows)
RUNS = [
    (INTERACTIONS, 'colliding_agents', colliding_agents, ('run', 'runs')),
    (INTERACTIONS, 'colliding_agents_adam', colliding_agents, ('run', 'runs')),
    (INTERACTIONS, 'theory_limits', theory_limits, ('run', 'versatility', 'genotype_all_tokens', 'genotype_always_active')),
    (INTERACTIONS, 'beyond_pairwise', beyond_pairwise, ('run', 'tasks')),
    (RF, 'random_features', random_features, ('run', 'main', 'by_N', 'by_M', 'claim1', 'claim1_samples', 'claim2',
                                               'claim2_samples', 'claim3', 'no_const')),
    (RF, 'random_features_d8', random_features, ('run', 'main')),
]


def load(folder):
    return json.loads((ROOT / 'results' / folder / 'results.json').read_text())


# the sections these checks cover (the heading's start; '' is the text before the first '## ');
# other sections of a doc report other files and are checked by their own tests
SECTIONS = {INTERACTIONS: ('', '## 1.', '## 2.', '## 3.', '## Left out'), RF: None}


def doc(name):
    return (ROOT / name).read_text()


def checked(name):
    """The doc's text in the sections listed in SECTIONS (None: all of it)."""
    text = doc(name)
    if SECTIONS[name] is None:
        return text
    parts = re.split(r'(?m)^(?=## )', text)
    return ''.join(p for p in parts if any(p.startswith(h) if h else not p.startswith('## ') for h in SECTIONS[name]))


@pytest.mark.parametrize('name, folder', [(d, f) for d, f, *_ in RUNS], ids=[f for _, f, *_ in RUNS])
def test_results_come_from_the_command_the_doc_shows(name, folder):
    r = load(folder)
    assert r['command'].startswith('python -m experiments.') and f'--out results/{folder}' in r['command']
    assert f"`{r['command']}`" in doc(name), f"{name} does not show the command of results/{folder}"
    assert r['wall_seconds'] > 0 and len(r['load_average']) == 2


@pytest.mark.parametrize('name, folder, module, blocks', RUNS, ids=[f for _, f, *_ in RUNS])
def test_generated_tables_appear_verbatim(name, folder, module, blocks):
    text, tables = doc(name), module.tables(load(folder))
    stale = [b for b in blocks if tables[b] not in text]
    assert not stale, (f"{name} is stale for results/{folder}: {stale}; paste the output of "
                       f"python -m {module.__name__} --tables results/{folder}")


def test_a_changed_number_makes_the_doc_stale():
    r = load('beyond_pairwise')
    r['three_way']['ha']['test_rel_mse']['mean'] *= 2
    assert beyond_pairwise.tables(r)['tasks'] not in doc(INTERACTIONS)


def test_tables_cli_prints_the_generated_blocks(capsys):
    folder = ROOT / 'results' / 'theory_limits'
    assert theory_limits.main(['--tables', str(folder)]) is None
    out = capsys.readouterr().out
    assert all(f'[{name}]' in out and block in out for name, block in theory_limits.tables(load('theory_limits')).items())


# -----------------------------------------------------------------------------
# numbers in the prose

NUMBER = re.compile(r'(?<![\w.])[-+−]?\d[\d,]*(?:\.\d+)?(?:e[-+−]?\d+)?%?')
# references, not results: sections, definitions, arXiv ids, venues
REFERENCE = re.compile(r'arXiv \d+\.\d+|(?:Section|Sec\.|§|Cor\.|Def|Eq\.|App\.|Fig\.|Table|Thm\.?) ?[A-Z]?\d+(?:\.\d+)*'
                       r'|(?:ICML|NeurIPS) \d+')
# decimals of the prose that are neither results nor settings in a results.json, and why
NOT_RESULTS = {
    INTERACTIONS: {
        '1e-7': "[IA]'s reported test MSE", '1e-5': "[IA]'s reported Ct*Wt difference (captions)",
        '1e-4': "[IA]'s Ct*Wt difference in its main text",
    },
    RF: {
        '20%': 'the validation split of the ridge selection (fit_select)',
        '1.0': 'the definition of the normalised error (predicting the mean)',
    },
}


def canonical(token):
    """'−0.054' -> '0.054', '4.3e-01' -> '4.3e-1', '20,000' -> '20000'."""
    t = token.replace('−', '-').lstrip('+-').replace(',', '')
    if 'e' in t:
        mant, exp = t.split('e')
        t = f"{mant}e{'-' if exp.startswith('-') else ''}{exp.lstrip('+-').lstrip('0') or '0'}"
    return t


def leaves(x):
    if isinstance(x, dict):
        for v in x.values():
            yield from leaves(v)
    elif isinstance(x, list):
        for v in x:
            yield from leaves(v)
    elif isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        yield x


def formatted(values):
    """Every way the docs write a number: 1-3 significant digits in e-notation, 0-3 decimals, a percentage."""
    out = set()
    for v in values:
        for f in ('.0e', '.1e', '.2e', '.0f', '.1f', '.2f', '.3f', '.1g', '.2g', '.3g', '.0%'):
            out.add(canonical(format(abs(v), f)))
    return out


def prose_numbers(text):
    """(line, number) of every decimal, e-notation or percentage outside tables, code and images."""
    fence = False
    for line in text.splitlines():
        if line.startswith('```'):
            fence = not fence
        if fence or line.startswith(('```', '|', '![')):
            continue
        for tok in NUMBER.findall(REFERENCE.sub('', line)):
            if re.search(r'[.e%]', tok):
                yield line, tok


@pytest.mark.parametrize('name', [INTERACTIONS, RF])
def test_every_decimal_in_the_prose_is_a_committed_number(name):
    allowed = formatted(v for d, folder, *_ in RUNS if d == name for v in leaves(load(folder)))
    allowed |= {canonical(k) for k in NOT_RESULTS[name]}
    bad = [(tok, line[:90]) for line, tok in prose_numbers(checked(name)) if canonical(tok) not in allowed]
    assert not bad, f"{name}: numbers in the prose that no committed results file holds: {bad}"


def test_only_the_listed_sections_are_checked(monkeypatch):
    before = checked(INTERACTIONS)
    text = doc(INTERACTIONS)
    extra = '\n## 9. Another study\n\nIts error 0.123456.\n\n![x](../assets/x.png)\n'
    monkeypatch.setattr(sys.modules[__name__], 'doc', lambda name: text + extra)
    kept = checked(INTERACTIONS)
    assert kept.rstrip() == before.rstrip() and '0.123456' not in kept
    assert '## 1. Colliding agents' in kept and '## Left out' in kept


def test_the_number_check_can_fail():
    assert not {canonical('0.61')} <= formatted([0.598])  # the cos error that once said 0.61 for 0.598
    assert canonical('−0.054') in formatted([-0.0541]) and canonical('4e-5') in formatted([3.96e-5])
    assert list(prose_numbers('| 0.5 |\nSee §7.1 and arXiv 2506.06179: error 0.25.\n```\n9.9\n```')) == \
        [('See §7.1 and arXiv 2506.06179: error 0.25.', '0.25')]


# sentences that quote a result, as the doc must read with the committed numbers (whitespace-insensitive)


def e(x, digits=1):
    """e-notation as the prose writes it: 2.5e-9, 5e-6."""
    return canonical(format(x, f'.{digits}e'))


def ca_runs(R):
    return {(r['embedding'], r['init']): r for r in R['colliding_agents']['runs']}


def ca_sentences(R):
    runs, adam = ca_runs(R), {(r['embedding'], r['init']): r for r in R['colliding_agents_adam']['runs']}
    theory = [runs['onehot', 'theory'], runs['sinusoidal', 'theory']]
    tests = [v for r in theory for v in r['test_mse'].values()]
    hist = dict(runs['onehot', 'normal']['loss_history'])
    return [
        f"runs took {theory[0]['train_seconds']:.0f} s (one-hot) and {theory[1]['train_seconds']:.0f} s (sinusoidal)",
        f"test MSE {e(min(tests))} to {e(max(tests))} vs ~1e-7",
        f"Ct*Wt difference {e(theory[0]['equivalence_msd'])} / {e(theory[1]['equivalence_msd'])} vs ~1e-5",
        f"one-hot: {hist[50]:.2f} after 50 evaluations, {hist[100]:.2f} after 100, "
        f"{runs['onehot', 'normal']['loss_history'][-1][1]:.2f} at the end",
        f"Var(y) = {R['colliding_agents']['target_var']:.2f}",
        f"Adam reaches train MSE {e(adam['onehot', 'theory']['train_mse'])} (one-hot) and "
        f"{e(adam['sinusoidal', 'theory']['train_mse'])} (sinusoidal), against {e(theory[0]['train_mse'])} and "
        f"{e(theory[1]['train_mse'])} for L-BFGS",
        f"Ct*Wt difference ({e(adam['onehot', 'theory']['equivalence_msd'])}) is at [IA]'s reported ~1e-5",
        f"({e(adam['onehot', 'theory']['test_mse']['20'])} at L = 20, {e(adam['onehot', 'theory']['test_mse']['40'])} "
        f"at L = 40)",
        f"(train MSE {adam['sinusoidal', 'normal']['train_mse']:.1f} from the normal initialisation, above Var(y))",
        f"train MSE {e(adam['onehot', 'normal']['train_mse'])} against {runs['onehot', 'normal']['train_mse']:.2f}",
        f"gets past it (train MSE {e(adam['onehot', 'normal']['train_mse'])}, the Adam table)",
    ]


def tl_sentences(R):
    gp = R['theory_limits']['genotype_phenotype']
    relu = [m['linear_sa_relu']['train']['all'] for g in gp.values() for m in g['regimes'].values()]
    lin = [m['linear_sa']['train']['all'] for g in gp.values() for m in g['regimes'].values()]
    at16 = lambda g, regime, model, split='all': gp[g]['regimes'][regime][model]['test']['16'][split]  # noqa: E731
    range4 = gp['n_always_0']['regimes']['range']
    return [
        f"(train MSE {e(min(relu))} to {e(max(relu))} vs {e(min(lin))} to {e(max(lin))})",
        f"e.g. {at16('n_always_2', 'fixed', 'linear_sa_relu'):.2f} vs {at16('n_always_2', 'fixed', 'linear_sa'):.2f} "
        f"at L = 16 with always-active alleles)",
        f"({at16('n_always_2', 'fixed', 'linear_sa_relu', 'always_active'):.2f} vs "
        f"{at16('n_always_2', 'fixed', 'linear_sa', 'always_active'):.1f})",
        f"(L = 4: {e(range4['linear_sa_relu']['test']['4']['all'], 0)} vs "
        f"{e(range4['linear_sa']['test']['4']['all'], 0)})",
    ]


def bp_sentences(R):
    hfa = sorted(R['beyond_pairwise']['coupled_features']['hfa_v1']['test_rel_mse']['values'])
    return [f"(test error {e(hfa[0])} for one seed, {e(hfa[1])} and {e(hfa[2])} for the other two)"]


def rf_sentences(R):
    r = R['random_features']
    main, by_M, by_N = r['results']['by_N']['16']['RFA'], r['results']['by_M'], r['results']['by_N']
    m = lambda M, t: by_M[str(M)]['RFA'][t]['mean'][0]  # noqa: E731
    c3 = r['claims']['claim3_higher_degree_needs_more_samples']['mean_error_over_n']
    adv = r['claims']['claim2_brfa_beats_rfa_on_dot_targets']['brfa_advantage']
    reach = r['claims']['claim2_brfa_beats_rfa_on_dot_targets']['n_to_reach_eps']['RFA']
    sec, nc = r['results']['seconds'], r['results']['no_const_coord']
    d8 = {model: {t: v['mean'][-1] for t, v in ts.items()}  # the d = 8 probe at n = 4096
          for model, ts in R['random_features_d8']['results']['by_N']['16'].items()}
    return [
        f"dot2 goes {m(128, 'dot2'):.3f} → {m(256, 'dot2'):.3f} and dot4 {m(128, 'dot4'):.3f} → {m(256, 'dot4'):.3f}, "
        f"cos less ({m(128, 'cos'):.3f} → {m(256, 'cos'):.3f}), dot3 hardly ({m(128, 'dot3'):.3f} → {m(256, 'dot3'):.3f})",
        f"({r['results']['by_N']['16']['BRFA']['dot3']['mean'][-1]:.3f} vs {main['dot3']['mean'][-1]:.3f} at 4096)",
        f"on the beta targets ({_minus(adv['beta2'])}, {_minus(adv['beta3'])})",
        f"for beta (RFA {c3['RFA']['beta2']:.3f} → {c3['RFA']['beta3']:.3f}, BRFA {c3['BRFA']['beta2']:.3f} → "
        f"{c3['BRFA']['beta3']:.3f})",
        f"of dot (RFA {c3['RFA']['dot2']:.3f} → {c3['RFA']['dot4']:.3f}, BRFA {c3['BRFA']['dot2']:.3f} → "
        f"{c3['BRFA']['dot4']:.3f})",
        f"floors of dot2 and dot4 at n = 4096 ({main['dot2']['mean'][-1]:.3f}, {main['dot4']['mean'][-1]:.3f})",
        f"floor near 0.2 ({main['dot3']['mean'][-1]:.3f})",
        f"is fit (RFA {nc['RFA']['beta3']['mean'][0]:.3f}; BRFA, whose mean score adds an even term, "
        f"{nc['BRFA']['beta3']['mean'][0]:.3f})",
        f"odd dot3 (RFA {c3['RFA']['dot3']:.3f}, BRFA {c3['BRFA']['dot3']:.3f}) is easier than dot2",
        f"the order is dot3 {reach['dot3']:.0f}, dot2 {reach['dot2']:.0f}, dot4 {reach['dot4']:.0f}, cos {reach['cos']:.0f}",
        f"at N = 4 it still learns dot3 ({by_N['4']['RFMLP']['dot3']['mean'][-1]:.3f}) and beta2 "
        f"({by_N['4']['RFMLP']['beta2']['mean'][-1]:.3f})",
        f"the M = 256 cells took {sec['M N=16 M=256']:.1f} s against {sec['M N=16 M=128']:.2f} s at M = 128",
        f"stay at error ≈ 1 up to n = 4096 (dot2 {d8['RFA']['dot2']:.3f}, dot4 {d8['RFA']['dot4']:.3f}, "
        f"cos {d8['RFA']['cos']:.3f})",
        f"(dot2 {d8['BRFA']['dot2']:.3f}, cos {d8['BRFA']['cos']:.3f} at n = 4096)",
        f"(RFA {d8['RFA']['dot3']:.3f}, {d8['RFA']['beta2']:.3f}, {d8['RFA']['beta3']:.3f} at n = 4096)",
    ]


def _minus(x):
    return f"{'−' if x < 0 else '+'}{abs(x):.3f}"


def test_the_d8_probe_says_what_its_curves_show():
    """'RFA's even-degree functions of <x_0,x_i> stay at error ≈ 1 up to n = 4096; RFMLP stays near 1 except
    on beta3': at every n of the probe, not only the table's."""
    r = load('random_features_d8')['results']['by_N']['16']
    assert min(v for t in ('dot2', 'dot4', 'cos') for v in r['RFA'][t]['mean']) >= 0.95
    assert min(v for t, c in r['RFMLP'].items() if t != 'beta3' for v in c['mean']) >= 0.95
    assert r['RFMLP']['beta3']['mean'][-1] < 0.5 and max(r['RFA'][t]['mean'][-1] for t in ('dot3', 'beta2', 'beta3')) < 0.5


PROSE = {INTERACTIONS: lambda R: ca_sentences(R) + tl_sentences(R) + bp_sentences(R), RF: rf_sentences}


@pytest.mark.parametrize('name', [INTERACTIONS, RF])
def test_sentences_quote_the_committed_numbers(name):
    R = {f: load(f) for d, f, *_ in RUNS if d == name}
    text = ' '.join(doc(name).split())
    missing = [s for s in PROSE[name](R) if ' '.join(s.split()) not in text]
    assert not missing, f"{name}: sentences that do not say what the committed results say: {missing}"


# -----------------------------------------------------------------------------
# figures


def shown_figures(name):
    return re.findall(r'!\[[^\]]*\]\(\.\./(assets/[^)]+\.png)\)', checked(name))


@pytest.mark.parametrize('name', [INTERACTIONS, RF])
def test_figures_were_drawn_by_the_committed_runs(name):
    runs = {(r['command'], r['run_id']) for r in (load(f) for d, f, *_ in RUNS if d == name)}
    figures = shown_figures(name)
    assert figures
    for fig in figures:
        assert png_source(ROOT / fig) in runs, f"{fig} was not drawn by a run whose results.json is committed"


# -----------------------------------------------------------------------------
# section 4: the read-out across seeds (results/readout_seeds/<variant>/seeds.json)

READOUT_SEEDS = sorted((ROOT / 'results' / 'readout_seeds').glob('*/seeds.json'))


def test_the_readout_across_seeds_is_committed():
    assert READOUT_SEEDS, "results/readout_seeds/<variant>/seeds.json: run the commands docs/interactions.md shows"


@pytest.mark.parametrize('path', READOUT_SEEDS, ids=[p.parent.name for p in READOUT_SEEDS])
def test_readout_across_seeds_tables_appear_verbatim(path):
    from nanohfa import interactions_seeds
    r = json.loads(path.read_text())
    text = doc(INTERACTIONS)
    assert f"`{r['command']}`" in text, f"{INTERACTIONS} does not show the command of {path}"
    assert f"--report_dir=results/readout_seeds/{path.parent.name}" in r['command']
    stale = [name for name, table in interactions_seeds.tables(r).items() if table not in text]
    assert not stale, f"{INTERACTIONS} is stale for {path}: paste python -m nanohfa.interactions_seeds {path}"


def test_readout_across_seeds_summary_appears_verbatim():
    """The side-by-side table of every variant read across seeds, as interactions_seeds.py prints it."""
    from nanohfa import interactions_seeds
    table = interactions_seeds.summary({p.parent.name: json.loads(p.read_text()) for p in READOUT_SEEDS})
    assert table in doc(INTERACTIONS), \
        f"{INTERACTIONS} lacks the current summary: paste the last table of python -m nanohfa.interactions_seeds results/readout_seeds/*/seeds.json"
