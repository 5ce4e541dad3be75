"""Host dashboard: CPU, memory, pressure, disks, network and filesystems."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from outrider.dashboards.panels import GREEN, SEL, dashboard, query, runbook, thresholds, ts


def build() -> Dashboard:
    d = dashboard("outrider-host", "Outrider / Host", "The host under the job: CPU, memory, pressure, disks, "
                  "network and the space left for checkpoints and data.", ["host"], ["namespace", "job", "instance"])
    d = d.with_row(Row("CPU and memory"))
    d = d.with_panel(ts("CPU utilisation", "Busy share of all CPUs (not idle, not waiting for I/O).", "percentunit",
                        query(f"outrider_host_cpu_utilization_ratio{{{SEL}}}", "{{instance}}"),
                        th=thresholds(GREEN, (0.9, "orange"), (0.95, "red")), min_val=0, max_val=1,
                        links=[runbook("exhaustion.md", "cpusaturated", "CPU saturated")]))
    d = d.with_panel(ts("CPU time by mode", "CPU seconds per second by mode (user, system, iowait, ...).", "short",
                        query(f'sum by (mode) (rate(outrider_host_cpu_seconds_total{{{SEL}, mode!="idle"}}'
                              "[$__rate_interval]))", "{{mode}}")))
    d = d.with_panel(ts("Memory", "Available memory against the total.", "bytes",
                        query(f"outrider_host_memory_available_bytes{{{SEL}}}", "available {{instance}}"),
                        query(f"outrider_host_memory_limit_bytes{{{SEL}}}", "total {{instance}}"),
                        query(f"outrider_host_memory_shared_bytes{{{SEL}}}", "shared (/dev/shm) {{instance}}"),
                        links=[runbook("exhaustion.md", "hostmemorynearlyfull", "host memory")]))
    d = d.with_panel(ts("Pressure (PSI)", "Share of time tasks were stalled on CPU, memory or I/O.", "percentunit",
                        query(f"rate(outrider_host_pressure_stalled_seconds_total{{{SEL}}}[$__rate_interval])",
                              "{{resource}} {{kind}}"), th=thresholds(GREEN, (0.1, "orange"), (0.25, "red")),
                        links=[runbook("exhaustion.md", "hostpressurestall", "pressure")]))
    d = d.with_panel(ts("Load and run queue", "Load average and runnable threads.", "short",
                        query(f"outrider_host_load1{{{SEL}}}", "load1 {{instance}}"),
                        query(f"outrider_host_procs_running{{{SEL}}}", "running {{instance}}"),
                        query(f"outrider_host_logical_cpus{{{SEL}}}", "CPUs {{instance}}")))
    d = d.with_panel(ts("OOM kills and major faults", "Kernel OOM kills and major page faults per interval.", "short",
                        query(f"increase(outrider_host_oom_kills_total{{{SEL}}}[$__rate_interval])",
                              "OOM kills {{instance}}"),
                        query(f'rate(outrider_host_page_faults_total{{{SEL}, type="major"}}[$__rate_interval])',
                              "major faults/s {{instance}}"),
                        th=thresholds(GREEN, (1, "red")),
                        links=[runbook("exhaustion.md", "hostoomkills", "OOM kills")]))
    d = d.with_row(Row("Disks and network"))
    d = d.with_panel(ts("Disk throughput", "Bytes read and written per device.", "Bps",
                        query(f"rate(outrider_host_disk_io_bytes_total{{{SEL}}}[$__rate_interval])",
                              "{{device}} {{direction}}")))
    d = d.with_panel(ts("Disk busy", "Share of time each device had I/O in flight.", "percentunit",
                        query(f"rate(outrider_host_disk_io_time_seconds_total{{{SEL}}}[$__rate_interval])",
                              "{{device}}"), min_val=0, max_val=1))
    d = d.with_panel(ts("Network throughput", "Bytes received and transmitted per interface.", "Bps",
                        query(f"rate(outrider_host_network_io_bytes_total{{{SEL}}}[$__rate_interval])",
                              "{{interface}} {{direction}}")))
    d = d.with_panel(ts("Network errors and drops", "Errors and dropped packets per interface.", "pps",
                        query(f"rate(outrider_host_network_errors_total{{{SEL}}}[$__rate_interval])",
                              "errors {{interface}} {{direction}}"),
                        query(f"rate(outrider_host_network_dropped_total{{{SEL}}}[$__rate_interval])",
                              "drops {{interface}} {{direction}}")))
    d = d.with_row(Row("Filesystems"))
    d = d.with_panel(ts("Filesystem space used", "Used share of each configured path's filesystem (checkpoint and "
                        "data directories).", "percentunit",
                        query(f"1 - outrider_host_filesystem_avail_bytes{{{SEL}}} / "
                              f"outrider_host_filesystem_size_bytes{{{SEL}}}", "{{mountpoint}}"),
                        th=thresholds(GREEN, (0.8, "orange"), (0.95, "red")), min_val=0, max_val=1,
                        links=[runbook("exhaustion.md", "diskfillingup", "disk filling")]))
    d = d.with_panel(ts("Filesystem space available", "Bytes an unprivileged writer can still use.", "bytes",
                        query(f"outrider_host_filesystem_avail_bytes{{{SEL}}}", "{{mountpoint}}")))
    return d
