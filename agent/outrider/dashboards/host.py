"""Host dashboard: CPU, memory, pressure, disks, network and filesystems, and the watched process tree (the job's
processes one by one, and their totals)."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row

from outrider.dashboards.panels import GREEN, SEL, dashboard, joined_table, query, runbook, stat, thresholds, ts


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
                        query(f"outrider_host_load5{{{SEL}}}", "load5 {{instance}}"),
                        query(f"outrider_host_load15{{{SEL}}}", "load15 {{instance}}"),
                        query(f"outrider_host_procs_running{{{SEL}}}", "running {{instance}}"),
                        query(f"outrider_host_procs_blocked{{{SEL}}}", "blocked on I/O {{instance}}"),
                        query(f"outrider_host_logical_cpus{{{SEL}}}", "CPUs {{instance}}")))
    d = d.with_panel(ts("Context switches", "Context switches per second on the host.", "short",
                        query(f"rate(outrider_host_context_switches_total{{{SEL}}}[$__rate_interval])",
                              "{{instance}}")))
    d = d.with_panel(ts("OOM kills and major faults", "Kernel OOM kills and major page faults per interval.", "short",
                        query(f"increase(outrider_host_oom_kills_total{{{SEL}}}[$__rate_interval])",
                              "OOM kills {{instance}}"),
                        query(f'rate(outrider_host_page_faults_total{{{SEL}, type="major"}}[$__rate_interval])',
                              "major faults/s {{instance}}"),
                        th=thresholds(GREEN, (1, "red")),
                        links=[runbook("exhaustion.md", "hostoomkills", "OOM kills")]))
    d = d.with_panel(ts("Memory by state", "Host memory used, free, cached and in buffers; dirty pages waiting to be "
                        "written back (checkpoint writes in flight).", "bytes",
                        query(f"outrider_host_memory_usage_bytes{{{SEL}}}", "{{state}} {{instance}}"),
                        query(f"outrider_host_memory_dirty_bytes{{{SEL}}}", "dirty {{instance}}")))
    d = d.with_panel(ts("Swap", "Swap used and free, and pages swapped in and out per second: a training host "
                        "that swaps is slow.", "short",
                        query(f"outrider_host_swap_usage_bytes{{{SEL}}}", "{{state}} bytes {{instance}}"),
                        query(f"rate(outrider_host_paging_operations_total{{{SEL}}}[$__rate_interval])",
                              "pages {{direction}}/s {{instance}}"),
                        th=thresholds(GREEN, (1, "orange"))))
    d = d.with_panel(ts("Container memory (cgroup)", "Memory charged to the cgroup the agent runs in (its container, "
                        "or the job's when the agent wraps it), the working set the kubelet evicts on, and the limit "
                        "at which the kernel OOM-kills inside it whatever the host has free.", "bytes",
                        query(f"outrider_cgroup_memory_usage_bytes{{{SEL}}}", "usage {{instance}}"),
                        query(f"outrider_cgroup_memory_working_set_bytes{{{SEL}}}", "working set {{instance}}"),
                        query(f"outrider_cgroup_memory_limit_bytes{{{SEL}}}", "limit {{instance}}"),
                        links=[runbook("exhaustion.md", "containermemorynearlimit", "container memory")]))
    d = d.with_panel(ts("Container CPU throttling (cgroup)", "Share of the cgroup's CFS periods in which it used up "
                        "its CPU quota and was throttled, and the time its tasks spent throttled per second, against "
                        "its limit in cores: a CPU-limited training container's data loaders starve here.", "short",
                        query(f"rate(outrider_cgroup_cpu_throttled_periods_total{{{SEL}}}[$__rate_interval]) / "
                              f"rate(outrider_cgroup_cpu_periods_total{{{SEL}}}[$__rate_interval])",
                              "throttled share {{instance}}"),
                        query(f"rate(outrider_cgroup_cpu_throttled_seconds_total{{{SEL}}}[$__rate_interval])",
                              "throttled s/s {{instance}}"),
                        query(f"outrider_cgroup_cpu_limit_cores{{{SEL}}}", "limit (cores) {{instance}}"),
                        links=[runbook("exhaustion.md", "trainingcputhrottled", "CPU throttled")]))
    d = d.with_panel(ts("Clock", "The node's clock against Prometheus's (seconds ahead, the sweep's own lag "
                        "included), whether the kernel says it is synchronised, and its bound on its own error: "
                        "several alerts compare the node's timestamps with Prometheus's time().", "s",
                        query(f"outrider_host_time_seconds{{{SEL}}} - timestamp(outrider_host_time_seconds{{{SEL}}})",
                              "skew {{instance}}"),
                        query(f"outrider_host_clock_max_error_seconds{{{SEL}}}", "max error {{instance}}"),
                        query(f"outrider_host_clock_synchronized{{{SEL}}}", "synchronised {{instance}}"),
                        links=[runbook("meta.md", "nodeclockskew", "clock skew")]))
    d = d.with_panel(ts("Container OOM kills (cgroup)", "Processes the kernel OOM-killed inside the cgroup per "
                        "interval.", "short",
                        query(f"increase(outrider_cgroup_memory_oom_kills_total{{{SEL}}}[$__rate_interval])",
                              "{{instance}}"), th=thresholds(GREEN, (1, "red"))))
    d = d.with_panel(ts("OOM kills by victim", "Processes the kernel OOM-killed per interval, by victim: the pod and "
                        "container, or the memory cgroup, and the process where the kernel log names it (the oom "
                        "collector, from a node agent's view of every cgroup); kills the host counted that no cgroup "
                        "named are unattributed.", "short",
                        query(f"increase(outrider_oom_victim_kills_total{{{SEL}}}[$__rate_interval])",
                              "{{victim}} on {{instance}}"),
                        query(f"increase(outrider_oom_unattributed_kills_total{{{SEL}}}[$__rate_interval])",
                              "unattributed ({{reason}}) on {{instance}}"),
                        query(f"outrider_oom_kernel_log_readable{{{SEL}}} == 0",
                              "kernel log unreadable (no process names) on {{instance}}"),
                        query(f"increase(outrider_oom_scans_total{{{SEL}}}[$__rate_interval])",
                              "looks at the cgroups on {{instance}}"),
                        th=thresholds(GREEN, (1, "red")),
                        links=[runbook("exhaustion.md", "hostoomkills", "OOM kills")]))
    d = d.with_row(Row("Disks and network"))
    d = d.with_panel(ts("Disk throughput", "Bytes read and written per device.", "Bps",
                        query(f"rate(outrider_host_disk_io_bytes_total{{{SEL}}}[$__rate_interval])",
                              "{{device}} {{direction}}")))
    d = d.with_panel(ts("Disk busy", "Share of time each device had I/O in flight.", "percentunit",
                        query(f"rate(outrider_host_disk_io_time_seconds_total{{{SEL}}}[$__rate_interval])",
                              "{{device}}"), min_val=0, max_val=1))
    d = d.with_panel(ts("Disk operations and latency", "Completed reads and writes per second, and their mean "
                        "latency (operation time over operations).", "short",
                        query(f"rate(outrider_host_disk_operations_total{{{SEL}}}[$__rate_interval])",
                              "ops/s {{device}} {{direction}}"),
                        query(f"rate(outrider_host_disk_operation_time_seconds_total{{{SEL}}}[$__rate_interval]) / "
                              f"rate(outrider_host_disk_operations_total{{{SEL}}}[$__rate_interval])",
                              "latency s {{device}} {{direction}}")))
    d = d.with_panel(ts("Disk queue", "I/O operations in flight on each device right now.", "short",
                        query(f"outrider_host_disk_io_in_progress{{{SEL}}}", "{{device}}")))
    d = d.with_panel(ts("Network throughput", "Bytes received and transmitted per interface.", "Bps",
                        query(f"rate(outrider_host_network_io_bytes_total{{{SEL}}}[$__rate_interval])",
                              "{{interface}} {{direction}}")))
    d = d.with_panel(ts("Network errors and drops", "Errors and dropped packets per interface.", "pps",
                        query(f"rate(outrider_host_network_errors_total{{{SEL}}}[$__rate_interval])",
                              "errors {{interface}} {{direction}}"),
                        query(f"rate(outrider_host_network_dropped_total{{{SEL}}}[$__rate_interval])",
                              "drops {{interface}} {{direction}}")))
    d = d.with_panel(ts("Network packets", "Packets received and transmitted per second per interface.", "pps",
                        query(f"rate(outrider_host_network_packets_total{{{SEL}}}[$__rate_interval])",
                              "{{interface}} {{direction}}")))
    d = d.with_row(Row("Filesystems"))
    d = d.with_panel(ts("Filesystem space used", "Used share of each configured path's filesystem (checkpoint and "
                        "data directories).", "percentunit",
                        query(f"1 - outrider_host_filesystem_avail_bytes{{{SEL}}} / "
                              f"outrider_host_filesystem_size_bytes{{{SEL}}}", "{{mountpoint}}"),
                        th=thresholds(GREEN, (0.8, "orange"), (0.95, "red")), min_val=0, max_val=1,
                        links=[runbook("exhaustion.md", "diskfillingup", "disk filling")]))
    d = d.with_panel(ts("Filesystem space available", "Bytes an unprivileged writer can still use.", "bytes",
                        query(f"outrider_host_filesystem_avail_bytes{{{SEL}}}", "available {{mountpoint}}"),
                        query(f"outrider_host_filesystem_free_bytes{{{SEL}}}", "free (with root's reserve) "
                              "{{mountpoint}}")))
    d = d.with_panel(ts("Inodes used", "Used share of each filesystem's inodes: at 100% no file can be created, "
                        "whatever the space (filesystems without a fixed inode table report no total and are left "
                        "out).", "percentunit",
                        query(f"1 - outrider_host_filesystem_files_free{{{SEL}}} / "
                              f"(outrider_host_filesystem_files{{{SEL}}} > 0)", "{{mountpoint}}"),
                        th=thresholds(GREEN, (0.8, "orange"), (0.95, "red")), min_val=0, max_val=1,
                        links=[runbook("exhaustion.md", "diskinodes", "inodes")]))
    d = d.with_panel(stat("Read-only filesystems", "Configured paths whose filesystem is mounted read-only: a "
                          "checkpoint written there fails.", "short",
                          query(f"sum(outrider_host_filesystem_readonly{{{SEL}}})", instant=True),
                          th=thresholds(GREEN, (1, "red"))))
    d = d.with_row(Row("Watched processes"))
    d = d.with_panel(stat("Watched tree alive", "1 while the root of the watched process tree lives (always 1 when "
                          "the whole host is watched).", "short",
                          query(f"min(outrider_watched_up{{{SEL}}})", instant=True),
                          th=thresholds((None, "red"), (1, "green")),
                          links=[runbook("meta.md", "watchedtargetabsent", "watched target absent")]))
    d = d.with_panel(stat("Processes", "Live processes in the watched tree.", "short",
                          query(f"sum(outrider_watched_processes{{{SEL}}})", instant=True)))
    d = d.with_panel(stat("Threads", "Threads of the live processes in the watched tree.", "short",
                          query(f"sum(outrider_watched_threads{{{SEL}}})", instant=True)))
    d = d.with_panel(stat("Resident memory", "Resident memory of the whole watched tree.", "bytes",
                          query(f"sum(outrider_watched_memory_rss_bytes{{{SEL}}})", instant=True)))
    d = d.with_panel(ts("Tree CPU and I/O", "CPU (1 = one core) and storage bytes per second of the whole watched "
                        "tree, exited processes included.", "short",
                        query(f"sum by (mode) (rate(outrider_watched_cpu_seconds_total{{{SEL}}}[$__rate_interval]))",
                              "CPU {{mode}}"),
                        query(f"sum by (direction) (rate(outrider_watched_io_bytes_total{{{SEL}}}[$__rate_interval]))",
                              "bytes/s {{direction}}")))
    d = d.with_panel(ts("Process CPU", "CPU of each watched process (top N; \"other\": the rest), 1 = one core.",
                        "percentunit",
                        query(f"sum by (pid, name) (rate(outrider_process_cpu_seconds_total{{{SEL}}}"
                              "[$__rate_interval]))", "{{pid}} {{name}}")))
    d = d.with_panel(joined_table(
        "Processes", "The watched processes shown one by one (top N), like top: user and command, CPU (1 = one core), "
        "resident memory, threads, open files, storage I/O, context switches and running time.", [
            ("CPU", "percentunit", query(f"sum by (instance, pid) (rate(outrider_process_cpu_seconds_total{{{SEL}}}"
                                         "[$__rate_interval]))")),
            ("Resident memory", "bytes", query(f"max by (instance, pid) (outrider_process_memory_rss_bytes{{{SEL}}})")),
            ("Threads", "short", query(f"max by (instance, pid) (outrider_process_threads{{{SEL}}})")),
            ("Open files", "short", query(f"max by (instance, pid) (outrider_process_open_fds{{{SEL}}})")),
            ("Storage I/O", "Bps", query(f"sum by (instance, pid) (rate(outrider_process_io_bytes_total{{{SEL}}}"
                                         "[$__rate_interval]))")),
            ("Context switches", "short",
             query(f"sum by (instance, pid) (rate(outrider_process_context_switches_total{{{SEL}}}"
                   "[$__rate_interval]))")),
            ("Running", "dtdurations",
             query(f"time() - max by (instance, pid) (outrider_process_start_time_seconds{{{SEL}}})")),
            ("User and command", "short",
             query(f"max by (instance, pid, name, user, command) (outrider_process_info{{{SEL}}})")),
        ], height=10))
    return d
