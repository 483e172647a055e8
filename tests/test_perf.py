"""perf counter tables, the `perf stat -x` parser, and PerfSession on this machine."""
from __future__ import annotations

import shutil
import time

import pytest

from hinabench.machine import perf

# Fixtures written from perf-stat(1) "CSV FORMAT": value;unit;event;run-time;percentage;
# [metric value;metric unit] -- plus the optional leading timestamp (-I) and aggregation id (-A),
# and -r's variance, which perf 6.x prints right after the event name.
SUPPORTED = """# started on Mon Nov 30 06:42:08 2026

1234567;;mem_load_l3_miss_retired.local_dram;2000000000;100.00;;
412;;mem_load_l3_miss_retired.remote_dram;2000000000;100.00;;
0.80;msec;task-clock;801253;100.00;0.355;CPUs utilized
"""
UNSUPPORTED = """<not supported>;;mem_load_l3_miss_retired.local_dram;0;100.00;;
<not supported>;;mem_load_l3_miss_retired.remote_dram;0;100.00;;
"""
NOT_COUNTED = """900;;ls_any_fills_from_sys.dram_io_near;1000;50.00;;
<not counted>;;ls_any_fills_from_sys.dram_io_far;0;0.00;;
"""
REPEAT = "0.50;msec;task-clock;9.35%;498045;100.00;0.383;CPUs utilized\n"
INTERVAL = """     0.101000463;10;;r0844;896882;100.00;;
     0.201515706;<not counted>;;r0844;0;100.00;;
     0.253438826;5;;r0844;176041;100.00;;
"""
PER_CPU = "CPU0;7;;r4044;1000;100.00;;\nCPU1;8;;r4044;1000;100.00;;\n"

SPR = perf.CpuId("GenuineIntel", 6, 0x8F, "Xeon 8480+")
ZEN3 = perf.CpuId("AuthenticAMD", 25, 0x01, "EPYC 7763")


def test_parse_supported():
    c = {x.event: x for x in perf.parse_perf_stat_csv(SUPPORTED)}
    assert c["mem_load_l3_miss_retired.local_dram"].value == 1234567
    assert c["mem_load_l3_miss_retired.remote_dram"].run_time == 2000000000
    tc = c["task-clock"]
    assert (tc.value, tc.unit, tc.percent_running, tc.metric_value, tc.metric_unit) == \
        (0.80, "msec", 100.0, 0.355, "CPUs utilized")
    table = perf.load_table(perf.TABLE_DIR / "intel-spr.toml")
    r = perf.result_from_counts(table, c)
    assert r.status == "ok"
    assert r.row()["remote_fraction_perf"] == pytest.approx(412 / (1234567 + 412))
    assert r.row()["dram_local_loads"] == 1234567 and r.row()["dram_remote_loads"] == 412


@pytest.mark.parametrize("text, status", [(UNSUPPORTED, "not supported"),
                                          (NOT_COUNTED, "not counted")])
def test_parse_missing_values_are_never_numbers(text, status):
    counts = perf.parse_perf_stat_csv(text)
    missing = [c for c in counts if c.status != "counted"]
    assert missing and all(c.value is None and c.status == status and c.reason for c in missing)
    table = perf.load_table(perf.TABLE_DIR / ("intel-spr.toml" if "mem_load" in text
                                              else "amd-zen4.toml"))
    row = perf.result_from_counts(table, perf.sum_counts(counts)).row()
    assert row["perf_status"] == "unsupported" and row["remote_fraction_perf"] is None
    assert status in row["perf_reason"]


def test_parse_repeat_interval_and_per_cpu():
    (c,) = perf.parse_perf_stat_csv(REPEAT)
    assert (c.value, c.variance, c.run_time, c.percent_running) == (0.5, "9.35%", 498045, 100.0)
    iv = perf.parse_perf_stat_csv(INTERVAL, interval=True)
    assert [x.timestamp for x in iv] == pytest.approx([0.101000463, 0.201515706, 0.253438826])
    assert perf.sum_counts(iv)["r0844"].value is None           # one interval missing: no total
    pc = perf.parse_perf_stat_csv(PER_CPU, aggregation_fields=1)
    assert [x.aggregation for x in pc] == [("CPU0",), ("CPU1",)]
    assert perf.sum_counts(pc)["r4044"].value == 15


def test_zero_denominator_is_no_number():
    table = perf.load_table(perf.TABLE_DIR / "amd-zen3.toml")
    zero = perf.parse_perf_stat_csv("0;;ls_any_fills_from_sys.mem_io_local;5;100.00;;\n"
                                    "0;;ls_any_fills_from_sys.mem_io_remote;5;100.00;;\n")
    r = perf.result_from_counts(table, perf.sum_counts(zero))
    assert r.row()["remote_fraction_perf"] is None and "zero denominator" in r.reason
    assert perf.evaluate_formula("remote / (local + remote)", {"local": 3, "remote": 1}) == 0.25
    with pytest.raises(ValueError):
        perf.evaluate_formula("__import__('os')", {})


def test_tables_load_and_select():
    tables = perf.load_tables()
    assert {"intel-spr", "intel-icx", "amd-zen3", "amd-zen4"} <= {t.name for t in tables}
    for t in tables:
        assert set(t.events) == {"local", "remote"}
        assert t.metrics["remote_fraction"] == "remote / (local + remote)"
    pick = lambda cpu: (perf.select_table(cpu)[0] or perf.CounterTable("", "", "", 0, (), {}, {})).name
    assert pick(SPR) == "intel-spr"
    assert pick(perf.CpuId("GenuineIntel", 6, 0xCF)) == "intel-spr"       # Emerald Rapids
    assert pick(perf.CpuId("GenuineIntel", 6, 0x6A)) == "intel-icx"
    assert pick(ZEN3) == "amd-zen3"
    assert pick(perf.CpuId("AuthenticAMD", 25, 0x21)) == "amd-zen3"        # Vermeer
    assert pick(perf.CpuId("AuthenticAMD", 25, 0x11)) == "amd-zen4"        # Genoa
    assert pick(perf.CpuId("AuthenticAMD", 25, 0xA0)) == "amd-zen4"        # Bergamo
    table, why = perf.select_table(perf.CpuId("AuthenticAMD", 26, 0x02))   # Zen 5: no table yet
    assert table is None and "no counter table" in why


def test_parse_cpuinfo():
    text = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n"
            "model name\t: AMD EPYC\nflags\t\t: fpu sse hypervisor\n\nprocessor\t: 1\n")
    cpu = perf.parse_cpuinfo(text)
    assert (cpu.vendor, cpu.family, cpu.model) == ("AuthenticAMD", 25, 1)
    assert "hypervisor" in cpu.flags
    assert perf.select_table(text)[0].name == "amd-zen3"


def test_no_table_no_perf():
    s = perf.PerfSession(cpuinfo="vendor_id\t: Made Up\ncpu family\t: 1\nmodel\t: 1\n")
    with s:
        s.enable()
        s.disable()
    assert s.result.row()["perf_status"] == "unsupported"
    table = perf.load_table(perf.TABLE_DIR / "intel-spr.toml")
    s = perf.PerfSession(table=table, perf="no-such-perf-binary")
    assert s.result.status == "unsupported" and "not found" in s.result.reason


needs_perf = pytest.mark.skipif(shutil.which("perf") is None, reason="perf not installed")


@needs_perf
def test_session_on_this_machine_is_honest():
    table, _ = perf.select_table()
    ok, _ = perf.probe(tuple(table.events.values())) if table else (False, "")
    with perf.PerfSession() as s:
        s.enable()
        sum(range(10000))
        s.disable()
    row = s.result.row()
    assert set(row) == set(perf.COLUMNS)
    if not ok:
        assert row["perf_status"] == "unsupported" and row["perf_reason"]
        assert row["remote_fraction_perf"] is None and row["dram_local_loads"] is None
    if table is None:      # a CPU with no counter table (e.g. a Xeon model the tables do not list)
        return
    perf.probe(tuple(table.events.values()))
    assert perf.probe.cache_info().hits >= 1                   # probed once, then cached


@needs_perf
def test_session_counts_only_between_enable_and_disable():
    """The control-fd mechanics, with software events every machine has."""
    sw = perf.CounterTable("sw", "software", "", 0, (), {"local": "task-clock",
                                                          "remote": "context-switches"},
                           {"remote_fraction": "remote / (local + remote)"})
    ok, why = perf.probe(tuple(sw.events.values()))
    if not ok:
        pytest.skip(why)

    def spin(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
    with perf.PerfSession(table=sw) as s:
        spin(0.3)                     # before enable: not counted
        s.enable()
        t0 = time.process_time()
        spin(0.05)
        inside_ms = (time.process_time() - t0) * 1000
        s.disable()
        spin(0.3)                     # after disable: not counted
    r = s.result
    assert r.status == "ok", r.reason
    ms = r.counts["local"].value      # task-clock, msec of CPU time while enabled
    # the shared machine may deschedule us, so compare with our own CPU time, not the wall clock;
    # the 0.6 s spun outside the window would show as ms >> inside_ms
    assert 0.5 * inside_ms <= ms <= inside_ms + 100, (ms, inside_ms)
