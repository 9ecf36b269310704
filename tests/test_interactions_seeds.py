"""interactions_seeds.py: the read-out across seeds. Heads are matched across seeds by rank
correlation; a structure's recurrence is the number of seeds whose matched head has it in
its top k; the stability score separates models that learned the same coefficients from
models that did not."""

import json
import math

import numpy as np
import pytest
import torch

import interactions as ia
from nanohfa import interactions_seeds as seeds
from nanohfa.errors import UserError
from experiments import colliding_agents as ca
from experiments.common import seed_all, torch_threads
from model import GPT, GPTConfig
from test_interaction_readout import as_attention_layer, save_ckpt


def fake_heads(gen, n_heads, n=12, shape=None):
    return [{'ranked': torch.randn(*(shape or (n, n)), generator=gen, dtype=torch.float64)} for _ in range(n_heads)]


def test_spearman_is_the_rank_correlation():
    from scipy import stats
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randperm(35, generator=gen).reshape(7, 5).double() for _ in range(2))
    assert seeds.spearman(x, y) == pytest.approx(stats.spearmanr(x.reshape(-1), y.reshape(-1)).statistic)
    assert seeds.spearman(x, 2 * x + 1) == pytest.approx(1.0)  # an increasing map keeps the ranks
    noisy = x * (x > 20) + 1e-5 * torch.randn(7, 5, generator=gen, dtype=torch.float64)  # zeros plus rounding noise
    assert seeds.spearman(noisy, x * (x > 20)) == pytest.approx(1.0)  # noise below 1e-3 of the largest: ties


def test_matching_undoes_a_permutation_of_heads():
    """Seed 1 holds seed 0's heads in another order, with noise: the assignment finds the order."""
    gen = torch.Generator().manual_seed(1)
    ref = fake_heads(gen, 4)
    order = [2, 0, 3, 1]  # seed 1's head j is seed 0's head order[j]
    other = [{'ranked': ref[i]['ranked'] + 0.3 * torch.randn(12, 12, generator=gen, dtype=torch.float64)}
             for i in order]
    assignment, rho = seeds.match_heads(ref, other)
    assert [order[j] for j in assignment] == [0, 1, 2, 3]
    assert all(rho[i, assignment[i]] > 0.9 for i in range(4))


def test_recurrence_counts_seeds_and_the_report_separates_majority_from_one_seed():
    """Three seeds of one head: the entry (0, 1) is the largest in all three, (2, 3) in seed 0
    only; a majority means more than half the seeds."""
    gen = torch.Generator().manual_seed(2)
    heads = fake_heads(gen, 3, n=6)
    for s, h in enumerate(heads):
        h['ranked'] = h['ranked'] * 0.01
        h['ranked'][0, 1] = 5.0
        if s == 0:
            h['ranked'][2, 3] = 4.0
    report = seeds.seed_stability([[h] for h in heads], list('abcdef'), k=2)
    group, = report['groups']
    assert group['recurring'][0]['text'] == 'a -> b' and group['recurring'][0]['seeds'] == 3
    assert 'c -> d' not in [r['text'] for r in group['recurring']]
    assert group['per_seed'][0][:2] == ['a -> b', 'c -> d']
    assert group['chance'] == pytest.approx(2 * 2 / 36)
    lines = seeds.stability_lines(report, ['s0', 's1', 's2'])
    assert 'a -> b (3/3)' in lines[2] and lines.index('each seed alone (one model each, not the architecture):') > 2


def test_triples_read_as_query_and_key_pair():
    assert seeds.structure_text(np.ravel_multi_index((1, 2, 0), (3, 3, 3)), (3, 3, 3), list('xyz')) == 'y <- (z, x)'


def colliding_agents_read_out(data_seed, init, N=24, R=1, L=6):
    """A colliding-agents linear SA ([IA] Cor. 4.9), trained on the data of one seed (or left at
    its random initialisation), as a model.py layer; its read-out's effective coefficients M."""
    with torch_threads(1):
        gen = seed_all(data_seed)
        P = ca.embedding(N, 'onehot')
        model = ca.LinearSA(P, init=init, gen=gen)
        if init == 'theory':
            s, y = ca.make_data(600, L, N, R, gen)
            ca.train(model, s, y, 60)
        layer, cfg = as_attention_layer(model.C.detach(), model.W.detach(), gen)
    e0 = torch.zeros(N, dtype=torch.float64)
    e0[0] = 1
    return ia.read_attention(layer.state_dict(), cfg, 'linear', P, out_direction=e0)


@pytest.mark.slow
def test_stability_separates_models_that_learned_the_same_interactions_from_ones_that_did_not():
    """Known answer: trained on the colliding-agents data of two different seeds, both models
    recover the devised coefficients, so the score calls them stable; two untrained models
    (random initialisations) are not."""
    labels = [str(i) for i in range(24)]
    # the devised interaction is -1 for the 120 colliding pairs (ring distance <= 1) and 0 elsewhere:
    # its strongest entries are the most negative, so the score reads -M, and k covers them all
    read = lambda init: [[{'ranked': -r['M']} for r in colliding_agents_read_out(s, init)] for s in (1, 2)]
    t = seeds.seed_stability(read('theory'), labels, k=120)['groups'][0]
    u = seeds.seed_stability(read('normal'), labels, k=120)['groups'][0]
    assert t['chance'] == pytest.approx(120 * 120 / 576)  # 25 of 120 by chance
    assert t['rho'][0] > 0.99 and t['overlap'][0] == 120 and len(t['recurring']) == 120
    assert abs(u['rho'][0]) < 0.2 and u['overlap'][0] < 40


@pytest.mark.slow
def test_command_line_over_several_checkpoints(tmp_path):
    """`--out_dir=a,b` (and a glob) reads every checkpoint, matches the heads and writes seeds.json;
    checkpoints of different models are refused with one line."""
    itos = list('abcdefghijklmnop')
    for s in range(3):
        torch.manual_seed(s)
        save_ckpt(tmp_path / 'runs' / f'seed{s}', GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2,
                                                                 n_embd=8, bias=False)), itos)
    report = ia.main([f"--out_dir={tmp_path / 'runs' / 'seed*'}", '--top_n=16', '--top_k=3', '--positions=none',
                      f"--report_dir={tmp_path / 'rep'}"])
    assert report['seeds'] == 3 and len(report['groups']) == 2 and report['attention'] == 'sa'
    assert json.loads((tmp_path / 'rep' / 'seeds.json').read_text())['groups'][0]['heads'][0] == 0
    assert (tmp_path / 'rep' / 'seeds_layer0_class_blocks.png').stat().st_size > 0
    assert 'token_share' not in report['groups'][0] and len(report['groups'][0]['offset_rho']) == 2  # positions=none
    save_ckpt(tmp_path / 'other', GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=4, n_embd=8,
                                                bias=False)), itos)
    with pytest.raises(UserError, match='is another model than'):
        ia.main([f"--out_dir={tmp_path / 'runs' / 'seed0'},{tmp_path / 'other'}", '--positions=none'])
    ckpt = torch.load(tmp_path / 'runs' / 'seed2' / 'ckpt.pt', weights_only=True)
    torch.save({**ckpt, 'iter_num': ckpt.get('iter_num', 0) + 7}, tmp_path / 'runs' / 'seed2' / 'ckpt.pt')
    with pytest.raises(UserError, match='at different iterations'):  # one run still training
        ia.main([f"--out_dir={tmp_path / 'runs' / 'seed*'}", '--positions=none'])
    with pytest.raises(UserError, match='names 1 checkpoint folder'):
        ia.main([f"--out_dir={tmp_path / 'runs' / 'seed0'},", '--positions=none'])


def test_a_triple_symmetric_in_its_keys_is_listed_once():
    """Shared key streams make T[a, b, c] = T[a, c, b]: (b, c) and (c, b) are one structure, so
    the top list and the chance level count each key pair once."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4, 4, 4, generator=gen, dtype=torch.float64)
    sym = x + x.transpose(1, 2)
    heads = [[{'ranked': sym}], [{'ranked': sym.clone()}]]
    group, = seeds.seed_stability(heads, list('wxyz'), k=6)['groups']
    triples = [(t.split(' <- ')[0], *t.split('(')[1].rstrip(')').split(', ')) for t in group['per_seed'][0]]
    assert len({(a, min(b, c), max(b, c)) for a, b, c in triples}) == 6  # no key pair twice
    assert all(b <= c for _, b, c in triples)
    assert group['chance'] == pytest.approx(6 * 6 / (4 * 4 * 5 / 2))
    assert seeds.one_order(x) is x  # not symmetric: every order is its own structure


def test_unrelated_heads_give_the_overlap_baseline():
    """Every head of both seeds favours the same entry (a token every head reads): matched heads
    overlap on it, and so do unrelated ones; the baseline reports that, where k^2 / M would not."""
    gen = torch.Generator().manual_seed(6)
    seeds_heads = fake_heads(gen, 3), fake_heads(gen, 3)
    for h in seeds_heads[0] + seeds_heads[1]:
        h['ranked'][0, 0] = 100.0
    group = seeds.seed_stability(list(seeds_heads), [str(i) for i in range(12)], k=1)['groups'][0]
    assert group['unrelated_overlap'] == 1.0 and group['chance'] == pytest.approx(1 / 144)


def test_token_classes_and_their_block_means():
    assert [seeds.token_class(t) for t in ['\u2423', '\\n', 'e', 'Q', ';', '#7']] == \
        ['space', 'newline', 'lowercase', 'capital', 'punctuation', 'other']
    x = torch.arange(16, dtype=torch.float64).reshape(4, 4)
    classes, blocks = seeds.class_blocks(x, ['a', 'b', 'C', '\u2423'])
    assert classes == ['space', 'lowercase', 'capital']
    assert blocks[1, 1] == x[:2, :2].mean() and blocks[0, 2] == x[3, 2] and blocks[1, 0] == x[:2, 3].mean()


def test_head_type_and_offset_agreement_come_from_each_seeds_measures():
    """measures: per seed, each head's token share and offset profile, read through the matching."""
    gen = torch.Generator().manual_seed(7)
    ref = fake_heads(gen, 2)
    other = [ref[1], ref[0]]  # seed 1 holds the heads swapped
    profile = [torch.tensor([3.0, 1.0, 0.0]), torch.tensor([0.0, 1.0, 3.0])]
    measures = [dict(token_share=[0.9, 0.1], offset_profile=profile),
                dict(token_share=[0.2, 0.8], offset_profile=profile[::-1])]
    g0, g1 = seeds.seed_stability([ref, other], [str(i) for i in range(12)], k=3, measures=measures)['groups']
    assert g0['heads'] == [0, 1] and g0['token_share'] == [0.9, 0.8] and g0['head_type'] == ['token', 'token']
    assert g1['token_share'] == [0.1, 0.2] and g1['head_type'] == ['positional', 'positional']
    assert g0['offset_rho'] == [pytest.approx(1.0)] and g1['offset_rho'] == [pytest.approx(1.0)]


def test_the_docs_tables_state_the_reports_numbers():
    """tables(): per group the matched heads, the correlations and overlaps the report holds, the
    unrelated-head baselines in their own row, and the majority structures with their seed counts."""
    gen = torch.Generator().manual_seed(8)
    ref = fake_heads(gen, 2, n=6)
    other = [{'ranked': ref[1]['ranked'] + 0.1}, {'ranked': ref[0]['ranked'].clone()}]
    report = seeds.seed_stability([ref, other], list('abcdef'), k=3)
    stability, recurring = seeds.tables(report).values()
    g0 = report['groups'][0]
    assert g0['heads'] == [0, 1] and g0['overlap'] == [3]
    assert f"| 0 | 0 1 | {g0['rho'][0]:.2f} [{g0['rho'][0]:.2f}, {g0['rho'][0]:.2f}] | 3.0 |" in stability
    assert f"| unrelated heads |  | {report['unrelated_rho']:.2f} |" in stability
    top = g0['recurring'][0]
    assert recurring.splitlines()[2].startswith(f"| 0 | `{top['text']}` 2,")


def test_the_summary_gives_one_row_per_variant_with_its_baselines_and_counts():
    """summary(): per variant the range of token shares, matched against unrelated agreement, and
    how many structures are in every seed's matched heads and in a majority's."""
    gen = torch.Generator().manual_seed(8)
    ref = fake_heads(gen, 2, n=6)
    other = [{'ranked': ref[1]['ranked'] + 0.1}, {'ranked': ref[0]['ranked'].clone()}]
    report = seeds.seed_stability([ref, other], list('abcdef'), k=3)
    for g in report['groups']:
        g.update(token_share=[0.1, 0.3], offset_rho=[0.5])
    row = seeds.summary({'one': report}).splitlines()[2]
    cells = [c.strip() for c in row.strip('|').split('|')]
    assert cells[0] == '`one`' and cells[1] == '2' and cells[2] == '0.10-0.30'
    assert cells[5].endswith(f"/ {np.mean([g['unrelated_overlap'] for g in report['groups']]):.1f}")
    every = sum(x['seeds'] == 2 for g in report['groups'] for x in g['recurring'])
    assert every > 0 and cells[7] == str(every)  # two identical heads share their whole top 3
    assert cells[8] == str(sum(len(g['recurring']) for g in report['groups']))
