"""tools/program_model.py: the whole-program model's arithmetic on a hand-written SASS
listing (known loops, trip counts -> known weighted totals), its scheduling, and the trip
counts it mirrors from the kernels' loop bounds. CUDA-free, no compile."""

import pytest

from tools import program_model as pm

# root: MOV, a guard over the outer loop (its preheader: IADD3), the outer loop (HGMMA,
# a guard over the inner loop with its preheader MOV, the inner loop: MUFU, BAR, back
# edge; then a wgmma wait and the back edge), EXIT, and the padding loop after EXIT
LISTING = """Function:k
--:-:-:-:2\tMOV R1, R2 ;
--:-:-:-:1\t@P0 BRA LBB1;
--:-:-:-:1\tIADD3 R3, R3, 0x1, RZ ;
LBB0:
--:-:-:-:1\tHGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;
--:-:-:-:1\t@P1 BRA LBB3;
--:-:-:-:1\tMOV R6, R7 ;
LBB2:
--:-:-:-:4\tMUFU.EX2 R5, R5 ;
--:-:-:-:1\tBAR.SYNC.DEFER_BLOCKING 0x0 ;
--:-:-:-:1\t@P2 BRA LBB2;
LBB3:
--:-:-:-:1\tWARPGROUP.DEPBAR.LE gsb0, 0x0 ;
--:-:-:-:1\t@P3 BRA LBB0;
LBB1:
--:-:-:-:1\tEXIT ;
LBB4:
--:-:-:Y:0\tBRA LBB4;
"""


def program(warps=4):
    return pm.structure(LISTING, warps)


def test_structure_finds_two_nested_loops_and_ignores_the_padding():
    p = program()
    assert p.shape() == (((),),)
    assert [p.own[k].instr for k in (0, 1, 2)] == [3, 4, 3]  # root, outer, inner
    assert p.guard[1].instr == 1 and p.guard[2].instr == 1   # the two preheaders


def test_weighted_totals_by_trip_count():
    # 3 outer iterations whose inner loops run 2, 0 and 3 times
    st = pm.run(program(), (((2,), (0,), (3,)),))
    assert st.instr == 3 + 1 + 3 * 4 + 2 * 1 + 5 * 3
    assert st.wg_flops == 3 * 2 * 64 * 64 * 16
    assert (st.mufu, st.bar, st.wait) == (5, 5, 3)
    assert st.stall == 4 + 1 + 3 * 4 + 2 * 1 + 5 * 6


def test_serial_rule_region_by_region():
    # per region: t_mma + max(issue = max(instr x warps / 4, stalls), exp = mufu x 32 x warps / 16)
    st = pm.run(program(), (((2,), (0,), (3,)),))
    root, guard_outer = 4, 1            # stalls 4 > 3 instructions; 1
    outer = 3 * (131072 / 4096 + 4)     # one 64x64x16 wgmma per iteration
    guard_inner = 2 * 1                 # entered twice (inner trips > 0)
    inner = 5 * max(6, 1 * 32 * 4 / 16)  # the exp unit bounds it: 8 cycles
    assert st.cycles == root + guard_outer + outer + guard_inner + inner == 155


def test_a_program_without_iterations_skips_the_guarded_code():
    st = pm.run(program(), ((),))  # the outer loop runs 0 times
    assert st.instr == 3 and st.cycles == 4


def test_a_trace_that_does_not_match_the_loops_is_refused():
    with pytest.raises(ValueError):
        pm.run(program(), (2, 3))
    with pytest.raises(ValueError):
        pm.run(program(), (4,))  # the outer loop has a loop inside: its iterations must be listed


def test_overlap_only_across_ctas():
    st = pm.run(program(), (((2,), (0,), (3,)),))
    assert pm.program_cycles(st, 4, 1) == 155
    # two CTAs per SM: half the serial time, but no less than the tensor time (3 x 32 cycles)
    assert pm.program_cycles(st, 4, 2) == max(155 / 2, 96, 33, 40) == 96


def test_occupancy_from_registers_and_shared_memory():
    assert pm.ctas_per_sm(235, 8, 49152) == 1    # 240 x 256 threads > 32768 registers
    assert pm.ctas_per_sm(120, 4, 20480) == 4    # 120 x 128 = 15360 registers a CTA
    assert pm.ctas_per_sm(64, 4, 100000) == 2    # shared memory: 2 x 101 KB fit 228 KB


def test_makespan_deals_programs_to_the_earliest_free_slot():
    assert pm.makespan([10, 10, 10], 2) == 20
    assert pm.makespan([30, 10, 10, 10], 2) == 30
    assert pm.makespan([1.0] * (pm.SMS * 4), pm.SMS) == 4  # full waves


def test_launch_repeats_one_heads_programs():
    p = program()
    one = pm.launch(p, [(((1,),),)], regs=255, smem=120000, heads=1, heads_fastest=False)
    many = pm.launch(p, [(((1,),),)] * 2, regs=255, smem=120000, heads=pm.SMS, heads_fastest=False)
    assert many['programs'] == 2 * pm.SMS
    assert many['cycles'] == 2 * one['cycles']  # two full waves of equal programs
    assert many['executed_flops'] == 2 * pm.SMS * one['executed_flops']


@pytest.mark.parametrize('T,wb,G,BB', [(96, 40, 4, 16), (80, 200, 2, 16), (64, 16, 1, 8), (64, 5, 3, 4)])
def test_ha_column_regions_cover_every_visible_key_and_leave_only_edges_masked(T, wb, G, BB):
    """The lanes' column sweeps (lead masked, unmasked, trail masked) of a query group:
    every visible b key of its queries lies in [lo, hi), the unmasked run is whole blocks
    that every query of the group sees, and the traces count ceil(length / BB) steps."""
    for i0 in range(0, T, G):
        rows = range(i0, min(i0 + G, T))
        lo, a, b, hi = pm._column_regions(rows[0], rows[-1], T, wb, BB)
        assert lo <= a <= b <= hi and (b - a) % BB == 0
        for i in rows:
            assert {j for j in range(T) if j <= i and i - j < wb} <= set(range(lo, hi))
            assert all(j <= i and i - j < wb for j in range(a, b))
        assert pm._sweeps(rows[0], rows[-1], T, wb, BB) == (-(-(a - lo) // BB), (b - a) // BB, -(-(hi - b) // BB))


def test_ha_forward_programs_in_launch_order():
    # T = 64, G = 4: program 0 takes the last queries (longest causal rows first); 8-lane a tiles
    progs = list(pm.ha_traces('ha_fwd', dict(G=4, BA=8, BB=16), 64, 12, 40, True))
    assert len(progs) == 16
    (outer,) = progs[0]  # queries 60..63: a keys within 12 -> 2 lane tiles; b keys 21..63
    assert len(outer) == 2 and outer[0] == pm._sweeps(60, 63, 64, 40, 16)
    (outer,) = progs[-1]  # queries 0..3: one lane tile
    assert len(outer) == 1


def test_hfa_forward_trips():
    # 128-row query blocks, 64-key blocks, causal, T = 512: block m sees keys [0, 128 (m + 1)),
    # all unmasked but for the two diagonal blocks
    tr = list(pm.flash_traces('hfa_fwd', dict(BM=128, BN=64), 512, True))
    assert tr == [(0, 0, 2), (0, 2, 2), (0, 4, 2), (0, 6, 2)]
    assert list(pm.flash_traces('hfa_fwd', dict(BM=128, BN=64), 256, False)) == [(0, 4, 0)] * 2
    assert list(pm.flash_traces('hfa_bwd_dkdv', dict(BM=16, BN=64), 256, True)) == [(16,), (12,), (8,), (4,)]


def test_useful_flops():
    assert pm.useful_forward('ha', 64, 8, True) == 4 * 64 * sum((i + 1) ** 2 for i in range(8))
    assert pm.useful_forward('ha', 64, 8, True, wa=2, wb=4) == 4 * 64 * sum(min(i + 1, 2) * min(i + 1, 4) for i in range(8))
    assert pm.useful_forward('hfa', 64, 8, False, A=2) == (4 * 64 + 1 + 2 * 64) * 64
    assert pm.fraction(pm.SMS * pm.MMA_FLOP_PER_CYCLE * 10, 20) == 0.5


def test_launch_integers_specialise_as_at_run_time():
    ints = pm.launch_ints(['Q', 'Tq', 'Tk', 'offset', 'Wa', 'Wb', 'qk_scale'], dict(T=4096, wa=32, wb=8193, dh=64), {})
    assert ints == dict(Tq=4096, Tk=4096, offset=0, Wa=32, Wb=8193)
    assert pm.specialise(4096) == ('i32', 'D') and pm.specialise(8193) == ('i32', '')
    assert pm.specialise(1) == ('constexpr', 1)


def test_global_load_bytes_per_warp():
    ld = [pm.Ins('LDGSTS.E.BYPASS.LTC128B.128 [R5], desc[UR28][R2.64], P0 ;', 1),
          pm.Ins('@!P0 LDG.E.64.CONSTANT R2, desc[UR4][R2.64] ;', 1), pm.Ins('LDG.E R6, desc[UR28][R2.64] ;', 1),
          pm.Ins('STG.E.128 desc[UR4][R2.64], R4 ;', 1)]
    assert pm.count(ld).ld_bytes == 32 * (16 + 8 + 4)  # stores are not loads


def test_loops_the_compiler_deleted_are_fitted_by_dropping_entries_empty_everywhere():
    p = program()  # one outer loop with one inner loop
    # a trace with an extra leading entry that is empty in every program, at both levels
    raw = [((), ((0, 2), (0, 1))), ((), ((0, 3),))]
    assert pm.squeeze(p, raw) == [(((2,), (1,)),), (((3,),),)]
    with pytest.raises(ValueError):  # not empty everywhere: cannot be the deleted loop
        pm.squeeze(p, [(1, ((0, 2),))])
