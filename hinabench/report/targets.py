"""The HiNa-MoE kernel's performance targets, judged on stored rows (`hinabench targets`).

The targets (issue 3 of this project, from the paper's claims), per (model, T, threads, NUMA policy):
  efficiency   >= 0.90 of the same-process roofline for T <= 4 (memory-bound decode),
               >= 0.75 for T >= 8; no target for T = 5..7;
  onednn       faster than oneDNN's pre-converted path (onednn:prepacked) at every T;
  peers        at least as fast as the best peer at T <= 4, faster at T >= 8.
A peer counts only if its row is `ok` (validated) and it reads the same weight bytes (a q8_0 or int8
peer streams half the bytes of a bf16 problem: another problem, not a competitor here). Two medians
closer than the larger of their MADs are a tie: "at least as fast" (T <= 4) passes on a tie,
"faster" (T >= 8, and than oneDNN) does not.
A target whose comparison row did not run (unsupported, wrong, missing) is `n/a`, with the reason;
it is never a pass.

The AVX2 path (`hina:avx2`) is judged by its own set (issue 11 of this project: AVX2-only CPUs, where
hina's kernel is the one to beat and there is no oneDNN bf16 path to compare with):
  efficiency   >= 0.90 for T <= 4 (>= 0.80 on Qwen3-30B-A3B's 128 small experts), >= 0.55 of the
               FMA roofline measured in the same round for T >= 16, >= 0.60 for T >= 64;
  gemm         for T >= 16, >= 0.85x the fp32 GEMM rate torch reaches in the same run (`gemm_gflops`:
               the achievable compute ceiling beside the register-only one);
  peers        faster than every validated same-bytes peer at every T (beyond the MAD), by >= 1.3x
               from T = 8;
  numa         hina:avx2-numa never slower than hina:avx2 by more than the MAD.

`judge_quant`: the quantized kernels' targets (issue 13), per (model, T, threads): INT8 at T <= 4
>= 0.85 of the same-process roofline on the bytes read (weights + scales); INT8 at T = 1 >= 1.6x hina
BF16 of the same run (side by side when their rows share a `cohort`: the `why` says which); INT8
faster than llamacpp:q8_0 at every T; INT8 faster than every validated
INT8 peer at T >= 8; FP8 at T <= 4 >= 0.9x the speed of hina INT8. Same rules: n/a is never a pass,
a tie within the MAD is not "faster".
"""
from __future__ import annotations

from dataclasses import dataclass

from ..harness.points import row_key
from .render import View

# every peer family the harness runs in its own environment (zentorch: AMD's ZenDNN extension, the
# fastest BF16 peer on Zen 4); torch and onednn are the framework baselines, judged on their own
PEER_FAMILIES = ("vllm", "kt", "ipex", "llamacpp", "zentorch")


@dataclass
class Verdict:
    model: str
    T: int
    threads: int
    numa: str
    backend: str
    target: str        # "efficiency", "onednn", "peers"
    want: str          # e.g. ">= 0.90", "< onednn:prepacked", "<= best peer"
    got: str
    verdict: str       # "pass" | "fail" | "n/a"
    why: str = ""

    def as_row(self) -> dict:
        return dict(self.__dict__)


def _f(r, c):
    try:
        v = float(r.get(c))
        return None if v != v else v
    except (TypeError, ValueError):
        return None


def _points(rows: list[dict]) -> list[dict[str, dict]]:
    """The rows by point (the FFN's Figure-10 points: same-experts routing), then by backend."""
    points: dict[tuple, dict[str, dict]] = {}
    for r in rows:   # bf16: the quantized rows have their own targets (judge_quant)
        if (r.get("op") or "ffn") != "ffn" or (r.get("routing") or "same-experts") != "same-experts" \
                or (r.get("dtype") or "bf16") != "bf16":
            continue
        points.setdefault(row_key(r, backend=False), {})[str(r.get("backend"))] = r
    return list(points.values())


def _mine(rows: list[dict], backend: str, out: list[Verdict]):
    """(rows of the point by backend, `backend`'s row, the verdicts' common fields) at every point where
    `backend` has an ok row; where its row is not ok, one `n/a` verdict goes to `out` instead."""
    for by in _points(rows):
        me = by.get(backend)
        if me is None:
            continue
        base = dict(model=me.get("model"), T=int(float(me["tokens_per_expert"])),
                    threads=int(float(me["threads"])), numa=me.get("numa") or "default", backend=backend)
        if me.get("status") != "ok":
            out.append(Verdict(**base, target="all", want="an ok row", got=str(me.get("status")),
                               verdict="n/a", why=str(me.get("reason") or "")))
            continue
        yield by, me, base


def _same_bytes_peers(by: dict, me: dict) -> tuple[list[dict], list[str]]:
    """(validated peer rows reading the same weight bytes as `me`, the peers that did not qualify)."""
    bytes_me = _f(me, "weight_bytes")
    peers = [r for b, r in by.items() if b.split(":")[0] in PEER_FAMILIES and r.get("status") == "ok"
             and _f(r, "weight_bytes") == bytes_me and _f(r, "median_ms")]
    others = sorted(b for b, r in by.items() if b.split(":")[0] in PEER_FAMILIES and r not in peers)
    return peers, others


def judge(rows: list[dict], backend: str) -> list[Verdict]:
    """Verdicts for every (model, T, threads, numa) point where `backend` has a row (the AVX2 path
    by its own set: judge_avx2)."""
    if backend.startswith("hina:avx2"):
        return judge_avx2(rows, backend)
    out: list[Verdict] = []
    for by, me, base in _mine(rows, backend, out):
        T = base["T"]
        t_me, mad_me = _f(me, "median_ms"), _f(me, "mad_ms") or 0.0
        eff = _f(me, "efficiency")
        if T <= 4 or T >= 8:
            bar = 0.90 if T <= 4 else 0.75
            out.append(Verdict(**base, target="efficiency", want=f">= {bar:.2f}",
                               got="-" if eff is None else f"{eff:.2f}",
                               verdict="n/a" if eff is None else ("pass" if eff >= bar else "fail"),
                               why=_with_turns(me, f"{me.get('bound')}-bound roofline {_f(me, 'roofline_ms'):.1f} ms"
                                               if _f(me, "roofline_ms") else "")))
        od = by.get("onednn:prepacked")
        if od is None or od.get("status") != "ok":
            out.append(Verdict(**base, target="onednn", want="< onednn:prepacked", got="-", verdict="n/a",
                               why="onednn:prepacked " + ("has no row" if od is None else
                                                          f"{od.get('status')}: {od.get('reason') or ''}")))
        else:
            t_od = _f(od, "median_ms")
            tie = abs(t_me - t_od) < max(mad_me, _f(od, "mad_ms") or 0.0)
            out.append(Verdict(**base, target="onednn", want="< onednn:prepacked (by more than the MAD)",
                               got=f"{t_me:.2f} vs {t_od:.2f} ms ({t_od / t_me:.2f}x)"
                                   + (" (tie within MAD)" if tie else ""),
                               verdict="pass" if t_me < t_od and not tie else "fail"))
        peers, others = _same_bytes_peers(by, me)
        if not peers:
            out.append(Verdict(**base, target="peers", want="best peer", got="-", verdict="n/a",
                               why="no peer ran validated on the same weight bytes"
                               + (f" ({', '.join(others)} did not)" if others else "")))
            continue
        best = min(peers, key=lambda r: _f(r, "median_ms"))
        t_p, mad_p = _f(best, "median_ms"), _f(best, "mad_ms") or 0.0
        tie = abs(t_me - t_p) < max(mad_me, mad_p)
        if T <= 4:   # at least as fast: faster, or a tie
            ok, want = t_me <= t_p or tie, "<= best peer (tie within MAD)"
        else:        # faster: by more than the noise
            ok, want = t_me < t_p and not tie, "< best peer (by more than the MAD)"
        note = " (tie within MAD)" if tie else ""
        out.append(Verdict(**base, target="peers", want=want,
                           got=f"{t_me:.2f} vs {best['backend']} {t_p:.2f} ms ({t_p / t_me:.2f}x){note}",
                           verdict="pass" if ok else "fail"))
    out.sort(key=lambda v: (v.model, v.numa, v.threads, v.T, v.target))
    return out


def _eff_bar_avx2(model: str, T: int) -> float | None:
    if T <= 4:
        return 0.80 if str(model).startswith("qwen3-30b") else 0.90
    if T >= 64:
        return 0.60
    if T >= 16:
        return 0.55
    return None


def judge_avx2(rows: list[dict], backend: str = "hina:avx2") -> list[Verdict]:
    """The AVX2 path's targets (see the module docstring) at every point where `backend` has a row."""
    out: list[Verdict] = []
    for by, me, base in _mine(rows, backend, out):
        model, T = base["model"], base["T"]
        t_me, mad_me = _f(me, "median_ms"), _f(me, "mad_ms") or 0.0
        bar = _eff_bar_avx2(model, T)
        if bar is not None:
            eff = _f(me, "efficiency")
            out.append(Verdict(**base, target="efficiency", want=f">= {bar:.2f}",
                               got="-" if eff is None else f"{eff:.2f}",
                               verdict="n/a" if eff is None else ("pass" if eff >= bar else "fail"),
                               why=_with_turns(me, f"{me.get('bound')}-bound, peak {_f(me, 'peak_gflops') or 0:.0f} "
                                                   f"GFLOP/s {me.get('peak_unit') or ''}".strip())))
        if T >= 16:
            g, gemm = _f(me, "gflops"), _f(me, "gemm_gflops")
            out.append(Verdict(**base, target="gemm", want=">= 0.85x torch fp32 GEMM",
                               got="-" if not (g and gemm) else f"{g:.0f} vs {gemm:.0f} GFLOP/s ({g / gemm:.2f}x)",
                               verdict="n/a" if not (g and gemm) else ("pass" if g >= 0.85 * gemm else "fail"),
                               why="" if gemm else "the row has no gemm_gflops (made before hinabench measured it)"))
        peers, others = _same_bytes_peers(by, me)
        if not peers:
            out.append(Verdict(**base, target="peers", want="faster than every peer", got="-", verdict="n/a",
                               why="no peer ran validated on the same weight bytes"
                               + (f" ({', '.join(others)} did not)" if others else "")))
        else:
            best = min(peers, key=lambda r: _f(r, "median_ms"))
            t_p, mad_p = _f(best, "median_ms"), _f(best, "mad_ms") or 0.0
            tie = abs(t_me - t_p) < max(mad_me, mad_p)
            ratio = t_p / t_me
            if T >= 8:
                ok, want = ratio >= 1.3 and not tie, ">= 1.3x the best peer"
            else:
                ok, want = t_me < t_p and not tie, "< best peer (by more than the MAD)"
            out.append(Verdict(**base, target="peers", want=want,
                               got=f"{t_me:.2f} vs {best['backend']} {t_p:.2f} ms ({ratio:.2f}x)"
                                   + (" (tie within MAD)" if tie else ""), verdict="pass" if ok else "fail"))
        if not backend.endswith("-numa"):
            nu = by.get(backend + "-numa")
            if nu is None or nu.get("status") != "ok":
                out.append(Verdict(**base, target="numa", want=f"{backend}-numa <= plain + MAD", got="-",
                                   verdict="n/a", why=f"{backend}-numa " + ("has no row" if nu is None else
                                                                          f"{nu.get('status')}")))
            else:
                t_n, mad_n = _f(nu, "median_ms"), _f(nu, "mad_ms") or 0.0
                ok = t_n <= t_me + max(mad_me, mad_n)
                out.append(Verdict(**base, target="numa", want=f"{backend}-numa <= plain + MAD",
                                   got=f"{t_n:.2f} vs {t_me:.2f} ms", verdict="pass" if ok else "fail"))
    out.sort(key=lambda v: (v.model, v.numa, v.threads, v.T, v.target))
    return out


def _with_turns(row: dict, why: str) -> str:
    """An efficiency verdict's `why`, with the row's turn-paired efficiency where it has one (the
    verdict itself is on `efficiency`, the conservative one: see runner._turn_efficiency)."""
    e = _f(row, "efficiency_turn")
    return why if e is None else f"{why}; {e:.2f} paired turn by turn with its probes"


def _side_by_side(a: dict, b: dict) -> str:
    """Whether two rows of different points (dtypes) took turns in the same rounds, said in words."""
    ca, cb = a.get("cohort"), b.get("cohort")
    if ca and ca == cb:
        return "side by side (one cohort of rounds)"
    return ("not side by side: measured in separate rounds, so the ratio carries the host's drift between "
            "them (a sweep measures a point's dtypes together unless --dtypes-apart)")


def judge_quant(rows: list[dict], backend: str) -> list[Verdict]:
    """Issue 13's targets for `backend` (a hina variant) on int8/fp8 rows (see the module docstring)."""
    by: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        if (r.get("op") or "ffn") != "ffn" or (r.get("routing") or "same-experts") != "same-experts":
            continue
        k = (r.get("model"), int(float(r["tokens_per_expert"])), int(float(r["threads"])), r.get("numa") or "default")
        by.setdefault(k, {})[(str(r.get("dtype")), str(r.get("backend")))] = r
    out: list[Verdict] = []

    def ok(r):
        return r is not None and r.get("status") == "ok" and _f(r, "median_ms")

    def faster(a, b):   # a faster than b by more than the larger MAD
        ta, tb = _f(a, "median_ms"), _f(b, "median_ms")
        return ta < tb and abs(ta - tb) >= max(_f(a, "mad_ms") or 0.0, _f(b, "mad_ms") or 0.0)

    for (model, T, thr, numa), d in sorted(by.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        base = dict(model=model, T=T, threads=thr, numa=numa, backend=backend)
        me = d.get(("int8", backend))
        if me is None:
            continue
        if not ok(me):
            out.append(Verdict(**base, target="int8", want="an ok row", got=str(me.get("status")), verdict="n/a",
                               why=str(me.get("reason") or "")))
            continue
        t_me = _f(me, "median_ms")
        if T <= 4:
            eff = _f(me, "efficiency")
            out.append(Verdict(**base, target="int8 efficiency", want=">= 0.85", got="-" if eff is None else f"{eff:.2f}",
                               verdict="n/a" if eff is None else ("pass" if eff >= 0.85 else "fail"),
                               why=_with_turns(me, f"{me.get('bound')}-bound roofline {_f(me, 'roofline_ms'):.1f} ms"
                                               if _f(me, "roofline_ms") else "")))
        if T == 1:
            bf = d.get(("bf16", backend))
            if not ok(bf):
                out.append(Verdict(**base, target="int8 vs bf16", want=">= 1.6x", got="-", verdict="n/a",
                                   why=f"no ok bf16 row of {backend}"))
            else:
                x = _f(bf, "median_ms") / t_me
                out.append(Verdict(**base, target="int8 vs bf16", want=">= 1.6x hina bf16", got=f"{x:.2f}x",
                                   verdict="pass" if x >= 1.6 else "fail", why=_side_by_side(me, bf)))
        q8 = [r for (dt, b), r in d.items() if b == "llamacpp:q8_0"]
        q8ok = [r for r in q8 if ok(r)]
        if not q8ok:
            why = ("llamacpp:q8_0 " + (f"{q8[0].get('status')}: {q8[0].get('reason') or ''}" if q8 else "has no row"))
            out.append(Verdict(**base, target="vs q8_0", want="< llamacpp:q8_0", got="-", verdict="n/a", why=why[:160]))
        else:
            p = min(q8ok, key=lambda r: _f(r, "median_ms"))
            out.append(Verdict(**base, target="vs q8_0", want="< llamacpp:q8_0",
                               got=f"{t_me:.2f} vs {_f(p, 'median_ms'):.2f} ms", verdict="pass" if faster(me, p) else "fail"))
        if T >= 8:
            peers = [r for (dt, b), r in d.items() if dt == "int8" and not b.startswith("hina:") and ok(r)]
            if not peers:
                out.append(Verdict(**base, target="int8 peers", want="< every int8 peer", got="-", verdict="n/a",
                                   why="no int8 peer ran validated"))
            else:
                slow = [r for r in peers if not faster(me, r)]
                best = min(peers, key=lambda r: _f(r, "median_ms"))
                out.append(Verdict(**base, target="int8 peers", want="< every validated int8 peer",
                                   got=f"{t_me:.2f} vs {best['backend']} {_f(best, 'median_ms'):.2f} ms "
                                       f"({_f(best, 'median_ms') / t_me:.2f}x)",
                                   verdict="fail" if slow else "pass"))
        if T <= 4:
            f8 = d.get(("fp8", backend))
            why = ""
            if not ok(f8):   # an ISA with no FP8 micro-kernel (AVX-512): hina's fastest FP8 path
                others = [r for (dt, b), r in d.items() if dt == "fp8" and b.startswith("hina:") and ok(r)]
                f8 = min(others, key=lambda r: _f(r, "median_ms")) if others else None
                why = f"{backend} has no fp8 row: {f8['backend']}'s" if f8 is not None else ""
            if not ok(f8):
                out.append(Verdict(**base, target="fp8 vs int8", want=">= 0.9x int8", got="-", verdict="n/a",
                                   why=f"no ok fp8 row of {backend} or any hina path"))
            else:
                x = t_me / _f(f8, "median_ms")
                out.append(Verdict(**base, target="fp8 vs int8", want=">= 0.9x int8 speed", got=f"{x:.2f}x",
                                   verdict="pass" if x >= 0.9 else "fail",
                                   why="; ".join(w for w in (why, _side_by_side(me, f8)) if w)))
    return out


def _style(r: dict):
    return {"pass": "green", "fail": "red", "n/a": "dim"}.get(r.get("verdict"))


VIEW = View([(c, c, None) for c in ("model", "T", "threads", "target", "want", "got", "verdict", "why")],
            style=_style, right=("T", "threads"))
