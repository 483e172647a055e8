"""The results store: one row schema per problem kind, rows on disk as CSV or Parquet.

Rows are appended as they are measured, so an interrupted sweep keeps every point it measured;
`--resume` skips the points already stored. How rows are printed (table, Markdown, CSV, JSON, ...) is
hinabench/report/render.py's job; this module only stores, reads, selects and ranks them.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import sys
import tempfile
import weakref
from pathlib import Path

from ..errors import UserError
from ..problems import KINDS
from .points import row_key

STATUSES = ("ok", "wrong", "failed", "unavailable", "unsupported", "timeout")
# Points with these statuses are measured again on --resume (they may have been transient).
RETRY_STATUSES = ("failed", "timeout")

# Every row: what was run (op, backend, the kind's own columns, threads, numa), then these.
HEAD = ["op", "backend"]
COMMON = [
    "threads", "numa",
    # outcome
    "status", "reason", "rank",
    "note",      # a caveat the backend states for every row of its kind (e.g. a peer's own thread pool)
    # timings (ms) over the samples of all rounds; warm-ups excluded
    "median_ms", "min_ms", "mean_ms", "mad_ms", "p10_ms", "p90_ms", "samples", "rounds", "warmup",
    "prepare_ms", "unstable",
    # validation
    "rel_err", "tolerance",
    # roofline
    "weight_bytes", "flops", "read_gbps", "read_gbps_min", "read_probe", "peak_gflops", "peak_unit",
    "peak_gflops_min", "peak_gflops_machine", "denominators_moved", "gemm_gflops", "pct_gemm",
    "roofline_ms", "bound", "gbps", "gflops", "pct_bw", "efficiency",
    "efficiency_turn",   # each turn's roofline (the probes beside its samples) over its median, median of turns
    # memory and cache policy
    "extra_bytes", "rotation_groups", "allocated_bytes",
    # NUMA: where the weights are (the placement model), and the remote traffic, modeled and counted
    "placement_policy", "placement_nodes", "placement_page_bytes", "placement_phase",
    "placement_backing", "placement_model_valid", "placement_reason",
    "weight_huge_fraction",   # the share of the bytes the kernel reads on transparent huge pages
    "work_partition", "remote_fraction_model", "remote_fraction_basis",
    "remote_fraction_perf", "dram_local_loads", "dram_remote_loads", "perf_status", "perf_reason",
    # conditions
    "load_other_cpus", "load_warning", "loadavg_before",
    # provenance
    "machine", "fingerprint", "versions", "hinabench_version", "git_rev", "timestamp", "command",
    "run_id",    # one per invocation: of several rows of one point, readers take the latest run's
    "cohort",    # rows measured in the same interleaved rounds across points (one model and T in several
                 # dtypes): ratios between them are side by side; empty for a point measured alone
]


def schema(op: str = "ffn") -> list[str]:
    """The columns of a row of problem kind `op`, in file order."""
    return HEAD + list(KINDS[op].columns) + COMMON


COLUMNS = schema("ffn")                 # the FFN schema (`hinabench ffn`)


def empty_row(op: str = "ffn") -> dict:
    return {c: None for c in schema(op)}


class ResultStore:
    """Rows on disk: CSV (appended one row per write, fsynced) or Parquet (rewritten after each row).

    A CSV store is checked before anything is appended to it (`open_for_append`): its header must be
    a results header of this kind (a file of another schema, or garbage, is refused with one line),
    and a torn last row (an interrupted write: no newline at the end, or too few cells) is cut off,
    said so, and its point measured again.
    """

    def __init__(self, path: str | os.PathLike, op: str = "ffn"):
        self.path = Path(path)
        self.kind = "parquet" if self.path.suffix == ".parquet" else "csv"
        self.op = op
        self.columns = schema(op)
        self.file_columns: list[str] | None = None   # the header of an existing file we append to
        self.repaired: str = ""                       # what open_for_append repaired, in words
        self.appended = 0                             # rows this process appended
        self._unlock = None                           # gives up the writer's lock (open_for_append .. close)

    def check_writable(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"results file {self.path} is not writable: {e.strerror or e}") from None
        existed = self.path.exists()
        try:
            with open(self.path, "a"):
                pass
        except OSError as e:
            raise UserError(f"results file {self.path} is not writable: {e.strerror or e}") from None
        if not existed:
            self.path.unlink()   # created by the first row, so a run refused later leaves no empty file
        if self.kind == "parquet":
            try:
                import pyarrow  # noqa: F401
            except ImportError:
                raise UserError("writing .parquet needs pyarrow (pip install pyarrow), or use a .csv path") from None

    def open_for_append(self) -> None:
        """Take the file's writer lock, check an existing file's schema and repair a torn last row
        before any row is appended."""
        self.check_writable()
        self._take_lock()
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        if self.kind == "parquet":
            try:
                cols = list(_read_parquet(self.path).columns)
            except Exception as e:
                raise UserError(f"{self.path} is not a results file ({type(e).__name__}); "
                                f"write to a new file") from None
            self._check_header(cols)
            return
        data = self.path.read_bytes()
        head = data.split(b"\n", 1)[0].decode("utf-8", "replace").rstrip("\r")
        cols = next(csv.reader([head]), [])
        self._check_header(cols)
        cut = _torn_tail(data, len(cols))
        if cut is not None:
            with open(self.path, "r+b") as f:
                f.truncate(cut)
                f.flush()
                os.fsync(f.fileno())
            self.repaired = (f"{self.path}: the last row was torn (an interrupted write); it was removed "
                             f"and its point is measured again")

    def _take_lock(self) -> None:
        """One writer a results file: a second run appending to it (a resume while the first still runs)
        would measure the same points beside it, on the same cores, and could cut its half-written last
        row as torn. The lock is an flock on a file named after this path in the temporary folder (not
        beside the results, which are committed); the kernel drops it when the process ends. Where no
        lock file can be made, the run goes on without one."""
        if self._unlock is not None:
            return
        import fcntl
        key = hashlib.sha1(str(self.path.resolve()).encode()).hexdigest()[:24]
        folder = Path(tempfile.gettempdir()) / "hinabench-locks"
        try:
            folder.mkdir(exist_ok=True)
            if folder.stat().st_uid == os.getuid():
                folder.chmod(0o1777)   # every user's runs lock here (sticky: each removes only its own)
            f = open(folder / f"{key}.lock", "a+")
        except OSError:
            return
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            who = f.read().strip() or "another process"
            f.close()
            raise UserError(f"{self.path} is being written by another hinabench run ({who[:200]}): wait for it "
                            f"to end, or write to another file") from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}: {' '.join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))}")
        f.flush()
        self._unlock = weakref.finalize(self, f.close)   # once: by close(), or when the store is dropped

    def close(self) -> None:
        """Give up the writer's lock (also when the store is dropped, or the process ends)."""
        if self._unlock is not None:
            self._unlock()
            self._unlock = None

    def _check_header(self, cols: list[str]) -> None:
        """A results file of this kind, possibly written by an older hinabench (fewer columns), is
        appended to in its own header; anything else is refused."""
        from ..problems import KINDS
        missing = [c for c in self.columns if c not in cols]
        extra = [c for c in cols if c not in self.columns]
        # the columns that name a point must be there, except those older rows read as defaults
        needed = ({"backend", "status", "threads", "numa"} | set(KINDS[self.op].key_columns)) - OPTIONAL_IN_OLD_FILES
        if extra or not cols or needed - set(cols):
            what = "garbage or another CSV" if "backend" not in cols or "status" not in cols else \
                f"another schema (missing {sorted(needed - set(cols))[:4] or missing[:4]}, unknown {extra[:4]})"
            raise UserError(f"{self.path} is not a results file of {self.op} rows ({what}); nothing was appended: "
                            f"write to a new file")
        self.file_columns = cols
        if missing:
            self.repaired = (self.repaired + "; " if self.repaired else "") + (
                f"{self.path} was written by an older hinabench: new rows are stored in its columns "
                f"(without {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''})")

    def _check_defaults(self, row: dict, cols: list[str]) -> None:
        """A key column an older file lacks reads back as its default: a row whose value differs (an
        FFN point with `--fill normal` appended to a file from before `fill`) would be stored as another
        point, so it is refused."""
        from ..problems import KINDS
        kind = KINDS[self.op]
        for c in kind.key_columns:
            if c in cols or c not in kind.key_defaults:
                continue
            v = row.get(c)
            if v not in (None, "") and str(v) != str(kind.key_defaults[c]):
                raise UserError(f"{self.path} was written before the column {c!r} existed, so its rows read "
                                f"as {c}={kind.key_defaults[c]}; a {c}={v} row cannot be stored there: "
                                f"write to a new file")

    def rows(self) -> list[dict]:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return []
        if self.kind == "parquet":
            return _read_parquet(self.path).to_dict("records")
        with open(self.path, newline="") as f:
            rows = list(csv.DictReader(f))
        return [r for r in rows if None not in r and all(v is not None for v in r.values())]

    def done_keys(self) -> set[tuple]:
        return {row_key(r) for r in self.rows()
                if r.get("status") in STATUSES and r.get("status") not in RETRY_STATUSES}

    def append(self, row: dict) -> None:
        unknown = set(row) - set(self.columns)
        if unknown:   # a harness bug, never silently dropped
            raise ValueError(f"row has columns outside the {self.op} schema: {sorted(unknown)}")
        if row.get("status") not in STATUSES:
            raise ValueError(f"a row is never stored without a status (got {row.get('status')!r})")
        cols = self.file_columns or self.columns
        self._check_defaults(row, cols)
        row = {c: _cell(row.get(c)) for c in cols}
        if self.kind == "parquet":
            import pandas as pd
            df = pd.DataFrame(self.rows() + [row], columns=cols)
            tmp = self.path.with_suffix(".parquet.partial")
            df.to_parquet(tmp, index=False)
            os.replace(tmp, self.path)
            self.appended += 1
            return
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
        new = not self.path.exists() or self.path.stat().st_size == 0
        if new:
            w.writeheader()
            self.file_columns = cols
        w.writerow(row)
        self._write_row(buf.getvalue().encode())

    def rows_of_run(self, run_id: str) -> int:
        """Whole rows in the file that run `run_id` stored (what an interrupted run says it kept: a
        Ctrl-C between a row's write and any counter cannot make this wrong)."""
        return sum(1 for r in self.rows() if r.get("run_id") == run_id)

    def _write_row(self, data: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        before = os.fstat(fd).st_size
        try:
            written = os.write(fd, data)      # one write per row: a row is whole or torn at the end
            if written != len(data):
                raise OSError(28, f"short write ({written} of {len(data)} bytes): the disk or a size limit is full")
            os.fsync(fd)
        except OSError as e:
            try:                              # leave whole rows only: cut what was written of this one
                os.ftruncate(fd, before)
                os.fsync(fd)
            except OSError:
                pass
            raise UserError(f"could not write a row to {self.path} ({e.strerror or e}); the "
                            f"{self.appended} row(s) this run stored before are intact: free space and "
                            f"run again with --resume") from None
        finally:
            os.close(fd)
        self.appended += 1


OPTIONAL_IN_OLD_FILES = {"op", "routing", "batch_tokens", "run_id", "quant_group", "fill"}


def _torn_tail(data: bytes, ncols: int) -> int | None:
    """Where to cut a CSV so that it ends with a whole row, or None when it does."""
    if not data.endswith(b"\n"):
        return data.rfind(b"\n") + 1
    last_start = data.rfind(b"\n", 0, len(data) - 1) + 1
    if last_start == 0:
        return None            # the header alone
    last = data[last_start:].decode("utf-8", "replace")
    cells = next(csv.reader([last]), [])
    if len(cells) != ncols:
        return last_start
    return None


def _read_parquet(path):
    import pandas as pd
    return pd.read_parquet(path)


def _cell(v):
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, str) and ("\n" in v or "\r" in v):
        return " / ".join(x for x in v.splitlines() if x.strip())   # one line per row, always
    return v


def _read_csv(p: Path, problems: list[str]):
    """A results CSV as a DataFrame; rows that are not whole (torn, garbled) are left out and named
    in `problems`; a file that is not a results file is a UserError that names it."""
    import pandas as pd
    try:
        with open(p, newline="", encoding="utf-8", errors="replace") as f:
            reader = csv.reader(f)
            header = next(reader, [])
            if "backend" not in header or "status" not in header:
                raise UserError(f"{p} is not a results file (its first line is not a results header)")
            rows = []
            for line_no, cells in enumerate(reader, start=2):
                if len(cells) != len(header):
                    problems.append(f"{p} line {line_no}: not a whole row ({len(cells)} of "
                                    f"{len(header)} cells: a torn or garbled write); left out")
                    continue
                rows.append(cells)
    except csv.Error as e:
        raise UserError(f"{p}: not readable as CSV ({e})") from None
    df = pd.DataFrame(rows, columns=header).replace("", None)
    return df


RESULT_SUFFIXES = (".csv", ".parquet")
_GLOB_CHARS = set("*?[")


def results_files(paths) -> list[tuple[Path, bool]]:
    """The results files that `paths` name, as (path, named): a file is itself (named=True); a folder
    is every .csv and .parquet file under it, recursively (a results/ tree of machine folders, or a
    Parquet dataset: a folder of .parquet files, hive-style `key=value` sub-folders included); a glob
    (`results/*/`, `runs/**/*.csv`) is what it matches, each match expanded the same way. Files found
    inside a folder are named=False: one that is not a results file is skipped with a note, where a
    named one is an error. Sorted within each argument; arguments keep their order; no file twice."""
    import glob as globmod
    out: list[tuple[Path, bool]] = []
    seen: set[Path] = set()

    def add(p: Path, named: bool) -> None:
        key = p.resolve()
        if key not in seen:
            seen.add(key)
            out.append((p, named))

    def expand(p: Path, named: bool, arg: str) -> None:
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.suffix in RESULT_SUFFIXES and f.is_file()
                           and not f.name.startswith("."))
            if not found and named:
                raise UserError(f"no results files (.csv, .parquet) under {p}")
            for f in found:
                add(f, False)
        elif p.exists():
            add(p, named)
        else:
            raise UserError(f"no results file at {arg}")

    for arg in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
        text = os.fspath(arg)
        if _GLOB_CHARS & set(text) and not Path(text).exists():
            matches = sorted(globmod.glob(text, recursive=True))
            if not matches:
                raise UserError(f"no results files match {text}")
            before = len(out)
            for m in matches:
                mp = Path(m)
                if mp.is_dir() or mp.suffix in RESULT_SUFFIXES:
                    expand(mp, False, m)
            if len(out) == before:
                raise UserError(f"no results files (.csv, .parquet) match {text}")
        else:
            expand(Path(text), True, text)
    return out


def _hive_columns(path: Path) -> dict[str, str]:
    """`key=value` folders on a Parquet dataset file's path (hive partitioning), as columns."""
    cols = {}
    for part in path.parent.parts:
        if "=" in part:
            k, v = part.split("=", 1)
            if k:
                cols[k] = v
    return cols


def latest_per_point(df, problems: list[str] | None = None):
    """The re-run rule: of several rows of one point on one machine (`machine` + row_key), the
    latest wins: the one with the latest `timestamp`, ties and rows without one broken by reading
    order (later wins). Rows of different machines never supersede each other. Keeps reading order."""
    import pandas as pd
    if not len(df):
        return df
    if "timestamp" in df:
        ts = pd.to_datetime(df["timestamp"], utc=True, errors="coerce", format="ISO8601")
        order = [(-1 if pd.isna(t) else t.value) for t in ts]
    else:
        order = [-1] * len(df)
    machines = df["machine"].tolist() if "machine" in df else [None] * len(df)
    best: dict[tuple, int] = {}
    for i, r in enumerate(df.to_dict("records")):
        m = machines[i]
        k = ("" if m is None or (isinstance(m, float) and math.isnan(m)) else str(m),) + row_key(r)
        j = best.get(k)
        if j is None or (order[i], i) >= (order[j], j):
            best[k] = i
    keep = sorted(best.values())
    if len(keep) < len(df):
        if problems is not None:
            problems.append(f"{len(df) - len(keep)} row(s) superseded by a later run of the same point "
                            f"on the same machine (the latest is shown; --all shows every run)")
        df = df.iloc[keep].reset_index(drop=True)
    return df


def load_frame(paths, problems: list[str] | None = None, latest: bool = True, source: bool = False):
    """Stored rows from results files, folders of them or globs (CSV and Parquet; see results_files)
    as one DataFrame, numbers as numbers. Damaged rows are left out and described in `problems` (a
    list to append to), and so are files inside a given folder that are not results files. With
    `latest`, a point measured by several runs on one machine keeps only the latest run's row (the
    re-run rule, latest_per_point); the number superseded is appended to `problems` too. Rows of
    several machines sit side by side, told apart by their `machine` and `fingerprint` columns.
    With `source`, a `source` column names the file each row was read from."""
    import pandas as pd
    problems = [] if problems is None else problems
    frames = []
    for p, named in results_files(paths):
        try:
            if p.suffix == ".parquet":
                try:
                    f = _read_parquet(p)
                except Exception as e:
                    raise UserError(f"{p} is not a readable Parquet results file ({type(e).__name__})") from None
                if "backend" not in f or "status" not in f:
                    raise UserError(f"{p} is not a results file (no backend and status columns)")
                for k, v in _hive_columns(p).items():   # a partition folder fills its column's gaps
                    f[k] = f[k].where(f[k].notna(), v) if k in f else v
            else:
                f = _read_csv(p, problems)
            if source:
                f["source"] = str(p)
            frames.append(f)
        except UserError as e:
            if named:
                raise
            problems.append(f"{e}; skipped")
    frames = [f for f in frames if len(f.columns)]
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
    for c in ("tokens_per_expert", "batch_tokens", "experts", "threads", "median_ms", "min_ms", "p10_ms",
              "p90_ms", "mad_ms", "roofline_ms", "gbps", "pct_bw", "efficiency", "efficiency_turn", "rel_err",
              "read_gbps",
              "weight_bytes", "flops", "rank", "samples", "rounds", "warmup", "prepare_ms", "mean_ms",
              "gflops", "peak_gflops", "load_other_cpus", "remote_fraction_model", "remote_fraction_perf",
              "read_gbps_min", "extra_bytes", "rotation_groups", "allocated_bytes", "out_features",
              "weight_huge_fraction",
              "in_features", "hidden_size", "intermediate_size"):
        if c in df:
            df[c] = pd.to_numeric(df[c], errors="coerce")
    if latest:
        df = latest_per_point(df, problems)
    return df


def read_rows(paths, problems: list[str] | None = None, latest: bool = True) -> list[dict]:
    """Stored rows of results files, folders or globs (CSV or Parquet) as dicts, in reading order; NaN as None
    (see load_frame for `problems` and `latest`)."""
    df = load_frame(paths, problems, latest)
    rows = [{k: _cell(v) for k, v in r.items()} for r in df.to_dict("records")]
    for r in rows:  # whole-number columns that pandas read as float (a NaN in the column)
        for c in ("rank", "tokens_per_expert", "experts", "threads", "samples", "rounds", "warmup"):
            v = r.get(c)
            if isinstance(v, float) and v.is_integer():
                r[c] = int(v)
    return rows


def select_rows(rows: list[dict], models=None, backends=None, tokens=None, threads=None,
                statuses=None) -> list[dict]:
    """Rows matching every given filter. A backend filter without ':' is a family (hina matches
    hina:avx2, hina:amx-numa, ...); models match by name."""
    def fam_ok(b):
        return not backends or any(b == f or (":" not in f and b.split(":")[0] == f) for f in backends)

    def num_in(v, allowed):
        try:
            return not allowed or int(v) in allowed
        except (TypeError, ValueError):
            return False
    return [r for r in rows
            if (not models or r.get("model") in models) and fam_ok(str(r.get("backend")))
            and num_in(r.get("tokens_per_expert"), tokens) and num_in(r.get("threads"), threads)
            and (not statuses or r.get("status") in statuses)]


def rank_rows(rows: list[dict]) -> None:
    """Rank `ok` rows by median within each point (row_key without the backend); others get no rank."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        r["rank"] = None
        if r.get("status") == "ok" and r.get("median_ms") is not None:
            k = row_key(r, backend=False)
            groups.setdefault(k, []).append(r)
    for g in groups.values():
        for i, r in enumerate(sorted(g, key=lambda r: float(r["median_ms"])), 1):
            r["rank"] = i


