"""
Whole-program static model of a compiled kernel on sm_90 (H100), from its SASS.

tools/compile_check.py's loop-only estimate times the fastest loop of a kernel. This module
times what every program of the launch executes: each SASS region (a loop body, the code
between loops, the code outside every loop) is weighed by how often it runs for the shape,
read from the kernel's own loop bounds (the `trips` functions below mirror them), and the
programs are placed on the SMs in launch order.

Per region, per execution (one CTA on one SM; W warps; per warp: n instructions, s the sum
of their stall counts, e MUFU.EX2; F tensor FLOPs of the CTA):

    t_mma   = F / 4096                 (mma.sync FLOPs count twice: half the wgmma rate)
    t_issue = max(n x W / 4, s)         (4 schedulers; a warp issues no faster than its stalls)
    t_exp   = e x 32 x W / 16
    serial  = t_mma + max(t_issue, t_exp)

The serial rule is the headline: every step of these kernels waits for all of its wgmma
(WARPGROUP.DEPBAR ... 0x0) and crosses CTA barriers (BAR.SYNC), so within a CTA the tensor
core and the instruction issue take turns. A launch's time is the makespan of its programs
dealt in launch order to the earliest free of the 132 SMs, each SM running one program's
serial time at a time. Where several CTAs fit on one SM (registers, shared memory), one
CTA's tensor work could overlap another's issue: the overlap figure (`cycles_overlap`)
deals programs to SMs x CTAs-per-SM slots at max(serial / CTAs per SM, t_mma, n x W / 4,
t_exp) each; tools/calibration.py found it too optimistic against published kernels (the
two-CTA references ran at about half of it), so it is reported, not used. Memory latency
and bandwidth are not modelled (the calibration against published kernels absorbs them;
`load_bytes` counts the global loads, for the L2 traffic a speed implies).
"""

import dataclasses
import heapq
import re

SMS = 132
MMA_FLOP_PER_CYCLE = 4096  # 989 TFLOP/s dense bf16 / (132 SMs x 1.83 GHz)
CLOCK_HZ = 1.83e9
SCHEDULERS = 4
MUFU_LANES = 16
REGS_PER_SM = 65536
SMEM_PER_SM = 233472  # 228 KB, of which 1 KB per CTA is reserved


# -----------------------------------------------------------------------------
# SASS: instructions, loops and the forward branches that skip a loop

LABEL_RE = re.compile(r'^([\w.$]+):$')
BRANCH_RE = re.compile(r'\bBRA\s+`?\(?([\w.$]+)\)?')


def mma_flops(ins):
    """FLOPs of one tensor-core instruction for its executing unit (HGMMA: a warp group,
    HMMA: a warp)."""
    m = re.search(r'\bHGMMA\.(\d+)x(\d+)x(\d+)', ins)
    if m:
        M, N, K = map(int, m.groups())
        return 2 * M * N * K
    m = re.search(r'\bHMMA\.(\d+)\.', ins)
    if m:
        M, N, K = {'16816': (16, 8, 16), '1688': (16, 8, 8), '884': (8, 8, 4)}.get(m.group(1), (16, 8, 16))
        return 2 * M * N * K
    return 0


@dataclasses.dataclass
class Ins:
    text: str
    stall: int


def parse(sass):
    """(instructions, {label: index of the next instruction}). A line is `control<TAB>text`
    where control ends in the stall count (hex), or the text alone (stall 1)."""
    body, labels = [], {}
    for raw in sass.splitlines():
        s = raw.strip()
        if not s or s.startswith('Function:') or s.startswith('//'):
            continue
        m = LABEL_RE.match(s)
        if m:
            labels[m.group(1)] = len(body)
            continue
        ctrl, _, text = s.partition('\t')
        if not text:
            ctrl, text = '', s
        stall = int(ctrl.rsplit(':', 1)[-1], 16) if re.fullmatch(r'[-\w]+(:[-\w]+){4}', ctrl) else 1
        body.append(Ins(text.strip(), max(stall, 1)))
    return body, labels


@dataclasses.dataclass
class Stats:
    """Counts of one region execution (per warp, but `flops`, the CTA's) and its cycles."""
    instr: float = 0
    stall: float = 0
    wg_flops: float = 0    # HGMMA FLOPs per warp group
    sync_flops: float = 0  # HMMA FLOPs per warp
    mufu: float = 0
    bar: float = 0
    wait: float = 0        # waits for every wgmma in flight
    ld_bytes: float = 0    # global loads (LDG, LDGSTS), bytes per warp with every lane active
    cycles: float = 0      # the serial rule, summed region by region

    def __add__(self, o):
        return Stats(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(o))))

    def __mul__(self, k):
        return Stats(*(a * k for a in dataclasses.astuple(self)))


LOAD_BYTES = {'128': 16, '64': 8, 'U16': 2, 'S16': 2, 'U8': 1, 'S8': 1}


def count(instrs):
    st = Stats()
    for x in instrs:
        st.instr += 1
        st.stall += x.stall
        f = mma_flops(x.text)
        if 'HGMMA' in x.text:
            st.wg_flops += f
        elif 'HMMA' in x.text:
            st.sync_flops += f
        st.mufu += 'MUFU.EX2' in x.text
        st.bar += bool(re.match(r'(@!?U?P\w+\s+)?BAR\.', x.text))
        st.wait += 'WARPGROUP.DEPBAR' in x.text
        op = x.text.split()[1 if x.text.startswith('@') else 0].split('.')
        if op[0] in ('LDG', 'LDGSTS'):
            st.ld_bytes += 32 * next((LOAD_BYTES[p] for p in op[1:] if p in LOAD_BYTES), 4)
    return st


def flops(st, warps):
    """Executed tensor FLOPs of the CTA, and the same with mma.sync at half rate."""
    f = st.wg_flops * (warps // 4) + st.sync_flops * warps
    return f, f + st.sync_flops * warps


def times(st, warps):
    _, f_time = flops(st, warps)
    t_mma = f_time / MMA_FLOP_PER_CYCLE
    t_issue = max(st.instr * warps / SCHEDULERS, st.stall)
    t_exp = st.mufu * 32 * warps / MUFU_LANES
    return t_mma, t_issue, t_exp


def with_cycles(st, warps):
    t_mma, t_issue, t_exp = times(st, warps)
    st.cycles = t_mma + max(t_issue, t_exp)
    return st


@dataclasses.dataclass
class Program:
    """The loop structure of a SASS listing. Scope 0 is the whole kernel; scope k > 0 the
    k-th loop (label to last back edge). own[s]: the region of scope s outside its child
    loops and their guards; guard[s]: the code a forward branch skips together with loop s
    (run once per entry into s when s has at least one iteration); children[s]: its
    directly nested loops in listing order."""
    loops: list
    children: dict
    own: dict
    guard: dict
    warps: int
    conditional: set = dataclasses.field(default_factory=set)  # scopes that are if-regions (structure's ifs)

    def shape(self, s=0):
        """Nesting as nested tuples: () for a loop without loops inside."""
        return tuple(self.shape(c) for c in self.children[s])


def structure(sass, warps, ifs=False):
    """The Program of a SASS listing. With `ifs`, a predicated forward branch over code
    without loops is a conditional region too: a child of its scope whose trace entry is
    0 or 1 (how often it runs per execution of the scope); else such code counts as always
    run (an overcount where it is skipped)."""
    body, labels = parse(sass)
    ends = {}
    for i, x in enumerate(body):
        m = BRANCH_RE.search(x.text)
        if m and m.group(1) in labels and labels[m.group(1)] <= i:
            h = labels[m.group(1)]
            if h == i and not x.text.startswith('@'):
                continue  # `L: BRA L` after the last EXIT: padding, never reached
            ends[h] = max(ends.get(h, i), i)
    loops = sorted(((h, e) for h, e in ends.items()), key=lambda L: (L[0], -L[1]))
    if ifs:
        conds = []
        for i, x in enumerate(body):
            m = BRANCH_RE.search(x.text)
            if m and x.text.startswith('@') and m.group(1) in labels and labels[m.group(1)] > i + 1:
                a, b = i + 1, labels[m.group(1)] - 1
                crosses = any(not (e < a or h > b) and not (h <= a and b <= e) for h, e in loops)  # a guard, a loop exit
                inside = any(c <= a and b <= d for c, d in conds)
                if not crosses and not inside:
                    conds.append((a, b))
        loops = sorted(loops + conds, key=lambda L: (L[0], -L[1]))
        cond_set = set(conds)
    else:
        cond_set = set()
    spans = [(0, len(body) - 1)] + loops

    def parent(k):  # innermost scope strictly containing scope k
        a, b = spans[k]
        best = 0
        for j, (c, d) in enumerate(spans[1:], 1):
            if j != k and c <= a and b <= d and (c, d) != (a, b) and spans[best][1] - spans[best][0] >= d - c:
                best = j
        return best

    par = {k: parent(k) for k in range(1, len(spans))}
    children = {k: [j for j in range(1, len(spans)) if par[j] == k] for k in range(len(spans))}

    def scope_of(i):
        best = 0
        for j, (c, d) in enumerate(spans[1:], 1):
            if c <= i <= d and spans[best][1] - spans[best][0] >= d - c:
                best = j
        return best

    scope = [scope_of(i) for i in range(len(body))]
    guarded = [None] * len(body)
    for i, x in enumerate(body):  # a predicated forward branch over exactly one loop of its scope
        m = BRANCH_RE.search(x.text)
        if not (m and x.text.startswith('@') and m.group(1) in labels and labels[m.group(1)] > i):
            continue
        t = labels[m.group(1)]
        inside = [j for j in children[scope[i]] if i < spans[j][0] and spans[j][1] < t]
        crossing = [j for j in children[scope[i]] if spans[j][0] < t and spans[j][1] > i and j not in inside]
        if len(inside) == 1 and not crossing:
            for k in range(i + 1, t):
                if scope[k] == scope[i] and guarded[k] is None:
                    guarded[k] = inside[0]
    own = {k: [] for k in range(len(spans))}
    guard = {k: [] for k in range(len(spans))}
    for i, x in enumerate(body):
        m = BRANCH_RE.search(x.text)
        if m and not x.text.startswith('@') and labels.get(m.group(1)) == i:
            continue  # the padding loop
        (guard[guarded[i]] if guarded[i] is not None else own[scope[i]]).append(x)
    return Program(loops=loops, children=children, own={k: with_cycles(count(v), warps) for k, v in own.items()},
                   guard={k: with_cycles(count(v), warps) for k, v in guard.items()}, warps=warps,
                   conditional={k for k in range(1, len(spans)) if spans[k] in cond_set})


def squeeze(prog, traces, scope=0):
    """Traces fitted to the SASS where the compiler deleted loops it proved empty (e.g. a
    lead sweep whose bounds are equal expressions when a tile has one query, or without
    causality): at each scope with more trace entries than loops, the first positions
    that are empty (0 or no iterations) in every execution are dropped; a trace that
    cannot be fitted so raises ValueError."""
    kids = prog.children[scope]
    if traces and len(traces[0]) != len(kids):
        excess = len(traces[0]) - len(kids)
        empty = [i for i in range(len(traces[0])) if all(t[i] in (0, ()) for t in traces)]
        if excess < 0 or len(empty) < excess:
            raise ValueError(f'scope {scope}: {len(kids)} loops in the SASS, {len(traces[0])} in the trace')
        drop = set(empty[:excess])
        traces = [tuple(e for i, e in enumerate(t) if i not in drop) for t in traces]
    for i, k in enumerate(kids):
        if prog.children[k] and k not in prog.conditional:
            its = sorted({it for t in traces if not isinstance(t[i], int) for it in t[i]}, key=repr)
            new = dict(zip(its, squeeze(prog, its, k))) if its else {}
            traces = [t[:i] + (tuple(new[it] for it in t[i]),) + t[i + 1:] if not isinstance(t[i], int) else t
                      for t in traces]
    return traces


def run(prog, trace, scope=0, memo=None):
    """Stats of one execution of `scope`'s body. trace: one entry per child loop, in
    listing order; an entry is the loop's trip count (a loop without loops inside) or the
    tuple of its iterations' traces."""
    memo = {} if memo is None else memo
    key = (scope, trace)
    if key in memo:
        return memo[key]
    kids = prog.children[scope]
    if len(kids) != len(trace):
        raise ValueError(f'scope {scope}: {len(kids)} loops in the SASS, {len(trace)} in the trace')
    total = prog.own[scope]
    for k, tr in zip(kids, trace):
        n = tr if isinstance(tr, int) else len(tr)
        if n > 0:
            total = total + prog.guard[k]
        if k in prog.conditional:
            if not isinstance(tr, int) or tr not in (0, 1):
                raise ValueError(f'conditional region {k} runs 0 or 1 times, not {tr}')
            total = total + prog.own[k] * tr
        elif isinstance(tr, int):
            if prog.children[k]:
                raise ValueError(f'loop {k} has loops inside; its trace must list its iterations')
            total = total + prog.own[k] * tr
        else:
            for it in tr:
                total = total + run(prog, it, k, memo)
    memo[key] = total
    return total


# -----------------------------------------------------------------------------
# launches

def ctas_per_sm(regs, warps, smem):
    regs_cta = ((max(regs, 1) + 7) // 8) * 8 * 32 * warps
    by_regs = REGS_PER_SM // regs_cta
    by_smem = SMEM_PER_SM // (smem + 1024)
    return max(1, min(by_regs, by_smem, 64 // warps))


def program_cycles(st, warps, ctas):
    """A program's cost on its SM: serial when alone; with other CTAs beside it, its share
    of the serial time but no less than its use of the tensor core, the schedulers'
    issue slots or the exp unit (the stall floor is latency, which other CTAs hide)."""
    t_mma, _, t_exp = times(st, warps)
    return max(st.cycles / ctas, t_mma, st.instr * warps / SCHEDULERS, t_exp)


def makespan(durations, slots, costs=None):
    """Cycles until the last program ends, dealt in order to the earliest free slot; at
    least the summed cost / SMs."""
    free = [0.0] * min(slots, max(len(durations), 1))
    heapq.heapify(free)
    end = 0.0
    for d in durations:
        t = heapq.heappop(free) + d
        end = max(end, t)
        heapq.heappush(free, t)
    return max(end, sum(costs if costs is not None else durations) / SMS)


def launch(prog, traces, regs, smem, heads, heads_fastest):
    """Whole-launch figures for one kernel: `traces` is one head's programs in launch
    order (program_id 0), repeated over `heads` heads (heads on grid axis 0 when
    heads_fastest, else axis 1)."""
    memo = {}
    traces = squeeze(prog, list(traces))
    per = [run(prog, t, 0, memo) for t in traces]
    ctas = ctas_per_sm(regs, prog.warps, smem)
    serial = [p.cycles for p in per]
    cost = [program_cycles(p, prog.warps, ctas) for p in per]
    if heads_fastest:
        order = [x for x in serial for _ in range(heads)]
        order_cost = [x for x in cost for _ in range(heads)]
    else:
        order, order_cost = serial * heads, cost * heads
    total = Stats()
    for p in per:
        total = total + p
    span = makespan(order, SMS)  # the headline: one program's serial time at a time per SM
    span_overlap = makespan(order, SMS * ctas, order_cost)  # co-resident CTAs overlapping
    f_exec, _ = flops(total, prog.warps)
    return dict(cycles=span, cycles_overlap=span_overlap, programs=len(per) * heads, ctas_per_sm=ctas,
                executed_flops=f_exec * heads,
                load_bytes=total.ld_bytes * prog.warps * heads,
                per_program=total * (1 / max(len(per), 1)), serial_sum=sum(serial) * heads)


# -----------------------------------------------------------------------------
# trip counts: each kernel's loop bounds for one head, program by program, in launch order

def _trips(lo, hi, step):
    return max(0, -(-(hi - lo) // step))


def _cdiv(a, b):
    return -(-a // b)


def _column_regions(p_min, p_max, Tk, Wb, BB):  # ha/triton.py's _column_regions
    lo = max(0, p_min - Wb + 1)
    hi = min(p_max, Tk - 1) + 1
    in_lo = max(lo, p_max - Wb + 1)
    in_hi = min(p_min, Tk - 1) + 1
    n_in = max(in_hi - in_lo, 0) // BB
    lead_end = min(in_lo, hi)
    mid_end = max(in_lo + n_in * BB, lead_end)
    return lo, lead_end, mid_end, hi


def _sweeps(p_min, p_max, T, wb, BB):
    lo, a, b, hi = _column_regions(p_min, p_max, T, wb, BB)
    return (_trips(lo, a, BB), _trips(a, b, BB), _trips(b, hi, BB))


def ha_traces(name, c, T, wa, wb, causal):
    """HA (ha/triton.py), Tq = Tk = T, offset 0; wa, wb the effective windows of slot a
    (the lanes') and slot b (_geometry)."""
    pos = (lambda i: i) if causal else (lambda i: T - 1)
    if name in ('ha_fwd', 'ha_bwd_dq'):
        G, BA, BB = c['G'], c['BA'], c['BB']
        n = _cdiv(T, G)
        for pid in range(n):
            i0 = (n - 1 - pid) * G
            p_lo, p_hi = pos(i0), pos(min(i0 + G, T) - 1)
            outer = _trips(max(0, p_lo - (T - 1)), min(p_hi, wa - 1) + 1, BA)
            yield ((_sweeps(p_lo, p_hi, T, wb, BB),) * outer,)
    elif name == 'ha_bwd_dqa':
        G, BB, NG = c['G'], c['BB'], c['NG']
        n = _cdiv(T, NG * G)
        for pid in range(n):
            prog = n - 1 - pid
            s_end = min((prog + 1) * NG * G, T)
            yield (tuple(_sweeps(s, min(s + G, s_end) - 1, T, wb, BB) for s in range(prog * NG * G, s_end, G)),)
    elif name in ('ha_bwd_da', 'ha_bwd_dka', 'ha_bwd_dva'):
        JA, BU, BB = c['JA'], c['BU'], c['BB']
        for pid in range(_cdiv(T, JA)):
            ja0 = pid * JA
            ja_last = min(ja0 + JA, T) - 1
            if causal:
                its = [(max(ja0 + ub, 0), min(ja_last + ub + BU - 1, T - 1))
                       for ub in range(0, min(wa - 1, T - 1 - ja0) + 1, BU)]
            else:
                its = [(T - 1, T - 1)] * _trips(0, T, BU)
            yield (tuple(_sweeps(a, b, T, wb, BB) for a, b in its),)
    elif name in ('ha_bwd_db', 'ha_bwd_dkb', 'ha_bwd_dvb'):
        G, BA, BB, split = c['G'], c['BA'], c['BB'], c['SPLIT']
        for pid in range(_cdiv(T, BB)):
            c0 = pid * BB
            c_last = min(c0 + BB, T) - 1
            if causal:
                i_lo, i_hi = c0, min(T, c_last + wb)
                mid_lo = min(max(i_lo, c_last), i_hi)
                mid_hi = max(min(i_hi, c0 + wb), mid_lo)
            else:
                i_lo, i_hi, mid_lo, mid_hi = 0, T, 0, T

            def region(i_start, i_end, masked):
                its = []
                for s in range(i_start, i_end, G):
                    p_lo, p_hi = pos(s), pos(min(s + G, i_end) - 1)
                    t_lo, t_hi = max(0, p_lo - (T - 1)), min(p_hi, wa - 1) + 1
                    if causal and not masked and split in (0, 3):
                        full = s + G <= i_end and t_lo == 0 and p_hi <= T - 1
                        t_all = t_lo + (min(p_lo + 1, wa) // BA if full else 0) * BA
                        its.append((_trips(t_lo, t_all, BA), _trips(t_all, t_hi, BA)))
                    else:
                        its.append((_trips(t_lo, t_hi, BA),))
                return tuple(its)
            yield (region(i_lo, mid_lo, True), region(mid_lo, mid_hi, False), region(mid_hi, i_hi, True))
    else:
        raise KeyError(name)


def _key_range(m0, BM, BN, T, window, causal):  # triton_common.key_range, offset 0
    if not causal:
        return 0, T
    hi = min(min(m0 + BM, T), T)
    lo = max(m0 - window + 1, 0) * (window > 0)
    return (lo // BN) * BN, hi


def _full_blocks(m0, BM, BN, lo, hi, T, window, causal):  # triton_common.full_blocks, offset 0
    if causal:
        p_first, p_last = m0, min(m0 + BM, T) - 1
        need = max(p_last - window + 1 - lo, 0) * (window > 0)
        a = min(lo + (need + BN - 1) // BN * BN, hi)
        b = lo + max(min(p_first + 1, T) - lo, 0) // BN * BN
    else:
        a, b = lo, lo + max(T - lo, 0) // BN * BN
    return a, min(max(b, a), hi)


def _query_range(n0, BN, BM, T, window, causal):  # triton_common.query_range, offset 0
    if not causal:
        return 0, T
    lo = (max(n0, 0) // BM) * BM
    last = min(max(n0 + BN - 1 + window, 0), T)
    return lo, T - (T - last) * (window > 0)


def flash_traces(name, c, T, causal, window=0):
    """HFA (hfa/triton.py, any A) and quadratic linear attention (linear/triton.py)."""
    BM, BN = c['BM'], c['BN']
    if name == 'hfa_fwd':
        for pid in range(_cdiv(T, BM)):
            lo, hi = _key_range(pid * BM, BM, BN, T, window, causal)
            a, b = _full_blocks(pid * BM, BM, BN, lo, hi, T, window, causal)
            yield (_trips(lo, a, BN), _trips(a, b, BN), _trips(b, hi, BN))
    elif name in ('hfa_bwd_dq', 'linear_fwd', 'linear_bwd_dq'):
        for pid in range(_cdiv(T, BM)):
            lo, hi = _key_range(pid * BM, BM, BN, T, window, causal)
            yield (_trips(lo, hi, BN),)
    elif name in ('hfa_bwd_dkdv', 'linear_bwd_dkdv'):
        for pid in range(_cdiv(T, BN)):
            lo, hi = _query_range(pid * BN, BN, BM, T, window, causal)
            yield (_trips(lo, hi, BM),)
    else:
        raise KeyError(name)


def chunked_traces(name, c, T):
    """Chunked linear attention (linear/triton_chunked.py): the state pass is one program
    per head looping over the chunks; the others one program per (head, chunk), no loop."""
    nc = _cdiv(T, c['BT'])
    if name.startswith('linear_chunk_states'):
        return [(nc,)]
    return [()] * nc


def traces(name, c, shape):
    """(one head's program traces in launch order, heads on grid axis 0)."""
    if name.startswith('ha_'):
        return list(ha_traces(name, c, shape['T'], shape['wa'], shape['wb'], shape['causal'])), False
    if name.startswith('linear_chunk'):
        return chunked_traces(name, c, shape['T']), True
    return list(flash_traces(name, c, shape['T'], shape['causal'], shape.get('window', 0))), True


# -----------------------------------------------------------------------------
# useful FLOPs (model.py's mix_flops convention: visible pairs or triples only)

def visible(i, w):
    """Keys a causal query at position i sees in a window w (0: no window)."""
    return min(i + 1, w) if w > 0 else i + 1


def useful_forward(family, dh, T, causal, wa=0, wb=0, A=1):
    """Forward FLOPs of one head: HA 4 dh per visible (query, a key, b key); HFA
    (2 A dh + A - 1 + 2 dh) per visible pair; linear 4 dh per visible pair."""
    if family == 'ha':
        if not causal:
            return 4 * dh * T ** 3
        return 4 * dh * sum(visible(i, wa) * visible(i, wb) for i in range(T))
    pairs = T * (T + 1) // 2 if causal else T * T
    if family == 'hfa':
        return (2 * A * dh + A - 1 + 2 * dh) * pairs
    return 4 * dh * pairs


def fraction(flop, cycles):
    """Fraction of the dense bf16 peak of the whole GPU."""
    return flop / (cycles * SMS * MMA_FLOP_PER_CYCLE) if cycles else 0.0


# -----------------------------------------------------------------------------
# the integers a launch passes (tools/compile_check.py compiles with their run-time hints)

def launch_ints(arg_names, shape, constexprs):
    """{argument: value} of a kernel's integer arguments at `shape` (dict T, causal, wa, wb,
    window, dh, heads), as the wrappers pass them (offset 0, Tq = Tk = T)."""
    T, heads, dh = shape['T'], shape.get('heads', 16), shape['dh']
    known = dict(Tq=T, Tk=T, offset=0, Wa=shape.get('wa', 0), Wb=shape.get('wb', 0), window=shape.get('window', 0),
                 seqlen=T, sq_a=heads * T * dh, sk_a=heads * T * dh, plane_stride=heads * T * dh)
    if 'BT' in constexprs:
        known['nchunks'] = _cdiv(T, constexprs['BT'])
    return {n: known[n] for n in arg_names if n in known and n not in constexprs}


def specialise(value):
    """Triton's run-time specialisation of an integer argument: ('constexpr', 1) for 1,
    (type, 'D') when divisible by 16 (the compiler may assume it), else (type, '')."""
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.jit import native_specialize_impl
    return native_specialize_impl(CUDABackend, value, False, True, True)


def op_summary(family, fwd, bwd):
    """Whole-program figures of one attention operation from compile_check records of its
    forward and backward kernels (each with 'whole'): fractions of the dense peak by the
    useful FLOPs, and microseconds at 1.83 GHz. None when a kernel has no figure."""
    recs = list(fwd) + list(bwd)
    if not fwd or not bwd or any('cycles' not in r.get('whole', {}) for r in recs):
        return None
    sh = recs[0]['whole']['shape']
    fam = 'linear' if family.startswith('linear') else family
    u = useful_forward(fam, sh['dh'], sh['T'], sh['causal'], sh.get('wa', 0), sh.get('wb', 0), sh.get('A', 1))
    u *= sh.get('heads', 16)
    c_f = sum(r['whole']['cycles'] for r in fwd)
    c_b = sum(r['whole']['cycles'] for r in bwd)
    return dict(fwd=fraction(u, c_f), bwd=fraction(2 * u, c_b), fwd_bwd=fraction(3 * u, c_f + c_b),
                fwd_us=c_f / CLOCK_HZ * 1e6, bwd_us=c_b / CLOCK_HZ * 1e6, heads=sh.get('heads', 16),
                cycles=dict({r['kernel']: r['whole']['cycles'] for r in recs}))
