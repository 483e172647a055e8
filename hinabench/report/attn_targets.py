"""The attention kernel's performance targets (issue 14), judged on stored rows (`hinabench attn-targets`).

Per point of the judged backend (a hina variant), at one thread count:
  roofline  decode, batch 1, Qwen3-30B-A3B and Mixtral shapes, l >= 4096: (KV bytes read / the row's own
            best read probe) / median >= 0.85. Where the point is compute-bound on this machine (the FLOPs
            over the row's own FMA peak take longer than the KV bytes over its read probe: G query heads
            per KV head make 4 G d FLOPs per 4 d bytes of K and V) the verdict says so in `why`: the
            memory roofline cannot be reached there, whatever the kernel.
  sdpa      decode, batch 1, every l >= 1024: at least 2x faster than `torch:sdpa`.
  llamacpp  decode, every l: faster than `llamacpp:fa`.
  extend    extend, n = 128 over a 4096 prefix: faster than `torch:sdpa` (explicit mask); the compute-bound
            efficiency (GFLOP/s over the row's own FMA peak) is stated in `got`.
  vllm      (information, not an issue target) faster than `vllm:attn`, wherever it ran.
A comparison whose other row is not `ok` (unsupported, wrong, missing) is `n/a` with its reason, never a pass.
"""
from __future__ import annotations

from ..harness.stats import bound_ms
from .render import View
from .targets import Verdict, _f, _style

ROOFLINE_MODELS = ("qwen3-30b-a3b", "mixtral-8x7b")


def _key(r: dict) -> tuple:
    return (r.get("model"), r.get("phase"), r.get("layout"), r.get("block_size"), r.get("batch"),
            r.get("context"), r.get("extend"), r.get("ragged"), r.get("threads"), r.get("numa"))


def judge_attention(rows: list[dict], backend: str) -> list[Verdict]:
    points: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        if r.get("op") == "attention":
            points.setdefault(_key(r), {})[str(r.get("backend"))] = r
    out: list[Verdict] = []
    for by in points.values():
        me = by.get(backend)
        if me is None or me.get("status") != "ok":
            continue
        phase, B, l = me.get("phase"), int(me.get("batch")), int(me.get("context"))
        n = int(me.get("extend") or 0)
        t_me, mad_me = _f(me, "median_ms"), _f(me, "mad_ms") or 0.0
        where = f"{phase} {me.get('layout')} B={B}" + (f" n={n}" if phase == "extend" else "")
        base = dict(model=me.get("model"), T=l, threads=int(me.get("threads")), numa=str(me.get("numa")),
                    backend=backend)

        def versus(target: str, other: str, factor: float = 1.0, label: str = "") -> None:
            o = by.get(other)
            want = f"<= {other} / {factor:g}" if factor != 1.0 else f"< {other}"
            if o is None or o.get("status") != "ok":
                why = "no row" if o is None else f"{o.get('status')}: {str(o.get('reason') or '')[:160]}"
                out.append(Verdict(**base, target=target, want=want, got=f"{where}: {t_me:.3f} ms",
                                   verdict="n/a", why=why))
                return
            t_o, mad_o = _f(o, "median_ms"), _f(o, "mad_ms") or 0.0
            ok = t_me * factor <= t_o if factor != 1.0 else (t_me < t_o and abs(t_me - t_o) >= max(mad_me, mad_o))
            out.append(Verdict(**base, target=target, want=want,
                               got=f"{where}: {t_me:.3f} ± {mad_me:.3f} vs {t_o:.3f} ± {mad_o:.3f} ms "
                                   f"({t_o / t_me:.2f}x)", verdict="pass" if ok else "fail", why=label))

        if phase == "decode" and B == 1 and l >= 4096 and me.get("model") in ROOFLINE_MODELS:
            bw, pk = _f(me, "read_gbps"), _f(me, "peak_gflops")
            mem_ms, cmp_ms = bound_ms(me, bw, pk)
            frac = mem_ms / t_me
            why = (f"compute-bound here: FLOPs / FMA peak = {cmp_ms:.3f} ms > KV bytes / read probe = "
                   f"{mem_ms:.3f} ms, so at most {mem_ms / cmp_ms:.2f} of the memory roofline is reachable; "
                   f"efficiency vs max(both) = {cmp_ms / t_me if cmp_ms > mem_ms else frac:.2f}"
                   if cmp_ms > mem_ms else "")
            if _f(me, "efficiency_turn") is not None:   # runner._turn_efficiency: vs max(both), turn by turn
                why = "; ".join(w for w in (why, f"efficiency vs max(both) paired turn by turn with its probes "
                                                 f"{_f(me, 'efficiency_turn'):.2f}") if w)
            out.append(Verdict(**base, target="roofline", want=">= 0.85 of KV bytes / read probe",
                               got=f"{where}: {frac:.2f} ({_f(me, 'gbps'):.1f} of {bw:.1f} GB/s)",
                               verdict="pass" if frac >= 0.85 else "fail", why=why))
        if phase == "decode" and B == 1 and l >= 1024:
            versus("sdpa", "torch:sdpa", 2.0)
        if phase == "decode":
            versus("llamacpp", "llamacpp:fa")
        if phase == "extend" and n == 128 and l == 4096:
            eff = _f(me, "gflops") / _f(me, "peak_gflops") if _f(me, "peak_gflops") else None
            versus("extend", "torch:sdpa", label=f"compute-bound efficiency {eff:.2f} "
                   f"({_f(me, 'gflops'):.0f} of {_f(me, 'peak_gflops'):.0f} GFLOP/s)" if eff else "")
        versus("vllm (info)", "vllm:attn")
    out.sort(key=lambda v: (v.model, v.threads, v.target, v.T))
    return out


VIEW = View([("model", "model", None), ("l", "T", None)]
            + [(c, c, None) for c in ("threads", "target", "want", "got", "verdict", "why")],
            style=_style, right=("l", "threads"))
