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
"""
from __future__ import annotations

from dataclasses import dataclass

from ..harness.points import row_key
from .render import View

PEER_FAMILIES = ("vllm", "kt", "ipex", "llamacpp")


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


def judge(rows: list[dict], backend: str) -> list[Verdict]:
    """Verdicts for every (model, T, threads, numa) point where `backend` has a row."""
    points: dict[tuple, dict[str, dict]] = {}
    for r in rows:   # the FFN's Figure-10 points (same-experts routing) only
        if (r.get("op") or "ffn") != "ffn" or (r.get("routing") or "same-experts") != "same-experts":
            continue
        points.setdefault(row_key(r, backend=False), {})[str(r.get("backend"))] = r
    out: list[Verdict] = []
    for by in points.values():
        me = by.get(backend)
        if me is None:
            continue
        model, T, thr = me.get("model"), int(float(me["tokens_per_expert"])), int(float(me["threads"]))
        numa = me.get("numa") or "default"
        base = dict(model=model, T=T, threads=thr, numa=numa, backend=backend)
        if me.get("status") != "ok":
            out.append(Verdict(**base, target="all", want="an ok row", got=str(me.get("status")),
                               verdict="n/a", why=str(me.get("reason") or "")))
            continue
        t_me, mad_me = _f(me, "median_ms"), _f(me, "mad_ms") or 0.0
        eff = _f(me, "efficiency")
        if T <= 4 or T >= 8:
            bar = 0.90 if T <= 4 else 0.75
            out.append(Verdict(**base, target="efficiency", want=f">= {bar:.2f}",
                               got="-" if eff is None else f"{eff:.2f}",
                               verdict="n/a" if eff is None else ("pass" if eff >= bar else "fail"),
                               why=f"{me.get('bound')}-bound roofline {_f(me, 'roofline_ms'):.1f} ms"
                               if _f(me, "roofline_ms") else ""))
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
        bytes_me = _f(me, "weight_bytes")
        peers = [r for b, r in by.items() if b.split(":")[0] in PEER_FAMILIES and r.get("status") == "ok"
                 and _f(r, "weight_bytes") == bytes_me and _f(r, "median_ms")]
        others = sorted(b for b, r in by.items() if b.split(":")[0] in PEER_FAMILIES and r not in peers)
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


def _style(r: dict):
    return {"pass": "green", "fail": "red", "n/a": "dim"}.get(r.get("verdict"))


VIEW = View([(c, c, None) for c in ("model", "T", "threads", "target", "want", "got", "verdict", "why")],
            style=_style, right=("T", "threads"))
