"""Training job dashboard: step time, throughput, data wait, MFU and goodput, GPU use and memory, allocator,
stragglers, the instrumented processes (stalls, heartbeats, declared phases), the diagnosis' evidence, alerts."""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import AnnotationQuery, Dashboard, Row

from outrider.dashboards.panels import (
    DATASOURCE,
    GREEN,
    SEL,
    dashboard,
    percentiles,
    query,
    runbook,
    stat,
    thresholds,
    ts,
)

R = f'{SEL}, rank=~"$rank"'
G = f'{SEL}, gpu=~"$gpu"'


def firing_alerts_annotation() -> AnnotationQuery:
    return (AnnotationQuery().name("Firing alerts").datasource(DATASOURCE).enable(True).icon_color("red")
            .expr(f'ALERTS{{alertstate="firing", {SEL}}}'))


PEAK_S, TIMED_S = "outrider_train_flops_peak_seconds_total", "outrider_train_flops_timed_seconds_total"
GOODPUT = "outrider_train_goodput_seconds_total"


def _mfu(by: str) -> str:
    """MFU over the rate interval: the time the FLOPs would take at the devices' peak over the loop's time of the
    same steps (collectors/efficiency.py), summed `by`."""
    return (f"sum by ({by}) (rate({PEAK_S}{{{R}}}[$__rate_interval])) / "
            f"sum by ({by}) (rate({TIMED_S}{{{R}}}[$__rate_interval]))")


def _efficiency(d: Dashboard) -> Dashboard:
    d = d.with_row(Row("Efficiency: MFU and goodput"))
    d = d.with_panel(stat("MFU", "Model FLOPs utilisation of the selected ranks: their steps' FLOPs (one step counted "
                          "now and then, or declared with outrider.step(flops=)) over their devices' peak "
                          "(docs/efficiency.md).", "percentunit",
                          query(f"sum(rate({PEAK_S}{{{R}}}[$__rate_interval])) / "
                                f"sum(rate({TIMED_S}{{{R}}}[$__rate_interval]))", instant=True),
                          links=[runbook("efficiency.md", "trainingmfudrop", "MFU drop")]))
    d = d.with_panel(stat("Goodput", "The productive share (the steps' work) of the selected ranks' wall time across "
                          "their restarts, since the agent started.", "percentunit",
                          query(f'sum({GOODPUT}{{{R}, cause="productive"}}) / sum({GOODPUT}{{{R}}})', instant=True),
                          th=thresholds((None, "red"), (0.5, "orange"), (0.8, "green"))))
    d = d.with_panel(stat("Restarts", "Times a rank's process was replaced by a new one of the same training job.",
                          "short", query(f"sum(outrider_train_restarts_total{{{R}}})", instant=True),
                          th=thresholds(GREEN, (1, "orange"))))
    d = d.with_panel(stat("Tokens/s per device", "Tokens a second per device, the mean over the selected ranks.",
                          "short", query(f"avg(outrider_train_device_tokens_per_second{{{R}}})", instant=True)))
    d = d.with_panel(ts("MFU per training job", "Model FLOPs utilisation of each training job (all its ranks).",
                        "percentunit", query(_mfu("training_job"), "{{training_job}}"), min_val=0,
                        links=[runbook("efficiency.md", "trainingmfudrop", "MFU drop")]))
    d = d.with_panel(ts("MFU per rank", "Model FLOPs utilisation of each rank over its last window (the agent's, "
                        "between two of its publications): a rank below the others computes less of the time (a "
                        "straggler, or waiting for one).", "percentunit",
                        query(f"max by (training_job, rank) (outrider_train_mfu_ratio{{{R}}})",
                              "{{training_job}} rank {{rank}}"), min_val=0))
    d = d.with_panel(ts("FLOPs per step and model FLOP/s", "The model FLOPs of one step by dtype (as last counted, "
                        "or declared), and the FLOPs done a second.", "short",
                        query(f"max by (training_job, rank, dtype) (outrider_train_step_flops{{{R}}})",
                              "per step {{training_job}} rank {{rank}} {{dtype}}"),
                        query(f"sum by (training_job, rank, dtype) (rate(outrider_train_flops_total{{{R}}}"
                              "[$__rate_interval]))", "FLOP/s {{training_job}} rank {{rank}} {{dtype}}")))
    d = d.with_panel(ts("Peak FLOP/s per rank", "The peak each rank's MFU is judged against, by dtype: its devices' "
                        "(the GPU table at the NVML name and clock, the CPU's measured peak, or peak_flops).",
                        "flops", query(f"max by (training_job, rank, dtype) (outrider_train_peak_flops{{{R}}})",
                                       "{{training_job}} rank {{rank}} {{dtype}}")))
    d = d.with_panel(ts("Goodput and badput by cause", "Each training job's wall time so far (across restarts, "
                        "since the agent started) by cause: productive, data_wait, checkpoint, other, stall, "
                        "restart, startup.", "percentunit",
                        query(f"sum by (training_job, cause) ({GOODPUT}{{{R}}}) / ignoring (cause) group_left "
                              f"sum by (training_job) ({GOODPUT}{{{R}}})", "{{training_job}} {{cause}}"),
                        min_val=0, max_val=1))
    d = d.with_panel(ts("Goodput per rank", "The productive share of each rank's wall time so far, with a stall, "
                        "restart or start-up going on now counted.", "percentunit",
                        query(f"max by (training_job, rank) (outrider_train_goodput_ratio{{{R}}})",
                              "{{training_job}} rank {{rank}}"), min_val=0, max_val=1))
    d = d.with_panel(ts("Since each rank's first step", "Time since the first step of each rank's current process: "
                        "it starts again from zero when a restarted process steps.", "s",
                        query(f"time() - max by (training_job, rank) (outrider_train_first_step_timestamp_seconds"
                              f"{{{R}}})", "{{training_job}} rank {{rank}}")))
    return d


def build() -> Dashboard:
    d = dashboard("outrider-training", "Outrider / Training job",
                  "Step time, throughput, input pipeline, GPU use and memory of a training job, per rank.",
                  ["training"], ["namespace", "job", "instance", "rank", "gpu"]).annotation(firing_alerts_annotation())
    step = f"outrider_train_step_duration_seconds_bucket{{{R}}}"
    d = d.with_row(Row("Progress"))
    d = d.with_panel(stat("Steps/s", "Training steps completed per second, all selected ranks.", "ops",
                          query(f"sum(rate(outrider_train_steps_total{{{R}}}[$__rate_interval]))", instant=True)))
    d = d.with_panel(stat("Samples/s", "Samples processed per second (outrider.step(samples=...) or count_samples, "
                          "else the batches the DataLoaders yield).",
                          "short", query(f"sum(rate(outrider_samples_total{{{R}}}[$__rate_interval]))", instant=True)))
    d = d.with_panel(stat("Data-wait fraction", "Share of the loop's wall time spent waiting for the next batch (the "
                          "loop's data_wait part over all its parts, as the verdict, the run summary and outrider top "
                          "count it): above 30% the job is input-bound.", "percentunit",
                          query(f"sum(rate(outrider_train_loop_seconds_total{{{R}, part=\"data_wait\"}}"
                                f"[$__rate_interval])) / "
                                f"sum(rate(outrider_train_loop_seconds_total{{{R}}}[$__rate_interval]))",
                                instant=True),
                          th=thresholds(GREEN, (0.2, "orange"), (0.3, "red")),
                          links=[runbook("degradation.md", "inputpipelinebound", "input-bound")]))
    d = d.with_panel(stat("Last step", "Seconds since the last completed step (a stall shows here first).", "s",
                          query(f"time() - max(outrider_train_last_step_timestamp_seconds{{{R}}})", instant=True),
                          th=thresholds(GREEN, (300, "orange"), (1800, "red")),
                          links=[runbook("degradation.md", "trainingstalled", "stalled")]))
    d = d.with_panel(stat("Bottleneck", "The agent's verdict on why the job is slow (outrider_bottleneck): "
                          "checkpoint_bound, input_bound, host_bound, python_bound, compute_bound, "
                          "communication_bound, memory_pressure, memory_bandwidth_bound, throttled, waiting (on "
                          "something outside the process), idle or balanced "
                          "(none while a window is not judged); outrider top and outrider report show the evidence "
                          "and the advice.",
                          "short",
                          query(f"max by (class) (outrider_bottleneck{{{SEL}}}) == 1", "{{class}}", instant=True),
                          width=24, height=3))
    d = _efficiency(d)
    d = d.with_row(Row("Step time"))
    d = d.with_panel(ts("Step time p50 / p99", "Step time percentiles from the hook's histogram.", "s",
                        *percentiles(step, 0.5, 0.99),
                        links=[runbook("degradation.md", "steptimeregression", "step-time regression")]))
    d = d.with_panel(ts("Step time per rank", "Mean step time of each rank: a rank above the others is a "
                        "straggler the whole job waits for.", "s",
                        query(f"sum by (rank) (rate(outrider_train_step_duration_seconds_sum{{{R}}}[$__rate_interval]))"
                              f" / sum by (rank) (rate(outrider_train_step_duration_seconds_count{{{R}}}"
                              f"[$__rate_interval]))", "rank {{rank}}"),
                        links=[runbook("degradation.md", "stragglerrank", "straggler")]))
    d = d.with_panel(ts("GPU time per step", "GPU time between step ends from CUDA events (no synchronisation); "
                        "far below the step time means the GPU waits.", "s",
                        *percentiles(f"outrider_train_gpu_step_duration_seconds_bucket{{{R}}}", 0.5)))
    d = d.with_panel(ts("Data-loader wait p50 / p99", "Time the loop waited for each batch.", "s",
                        *percentiles(f"outrider_train_data_wait_seconds_bucket{{{R}}}", 0.5, 0.99)))
    d = d.with_row(Row("Where the loop's time goes"))
    d = d.with_panel(ts("Loop time by part", "The loop's wall time split exactly into data wait (inside the "
                        "DataLoader), the step's work, and the rest (logging, evaluation, checkpoints): the parts "
                        "add up to 1 per rank.", "percentunit",
                        query(f"sum by (rank, part) (rate(outrider_train_loop_seconds_total{{{R}}}"
                              "[$__rate_interval]))", "{{part}} rank {{rank}}"), min_val=0, max_val=1,
                        links=[runbook("degradation.md", "inputpipelinebound", "input-bound")]))
    d = d.with_panel(ts("Collectives", "Share of wall time in torch.distributed collectives by operation, and the "
                        "part of the step the loop was blocked in them: a rank that waits least is the straggler "
                        "the others wait for.", "percentunit",
                        query(f"sum by (rank, op) (rate(outrider_train_collective_seconds_total{{{R}}}"
                              "[$__rate_interval]))", "{{op}} rank {{rank}}"),
                        query(f"sum by (rank) (rate(outrider_train_collective_wait_seconds_total{{{R}}}"
                              "[$__rate_interval]))", "blocked rank {{rank}}"), min_val=0,
                        links=[runbook("degradation.md", "stragglerrank", "straggler")]))
    d = d.with_panel(ts("GPU-paced share of steps", "Share of step time during which the GPU was still working "
                        "off earlier queued work (from CUDA events, no synchronisation): near 1 the GPU paces the "
                        "loop (compute-bound), near 0 the host does.", "percentunit",
                        query(f"sum by (rank) (rate(outrider_train_gpu_busy_seconds_total{{{R}}}[$__rate_interval]))"
                              f" / sum by (rank) (rate(outrider_train_gpu_observed_seconds_total{{{R}}}"
                              "[$__rate_interval]))", "rank {{rank}}"), min_val=0, max_val=1))
    d = d.with_panel(ts("CPU by thread role", "CPU cores used by each role's threads (main loop, torch intra-op "
                        "pool, DataLoader workers, the hook, other) and the time they were runnable but waited for "
                        "a CPU: run delay means neighbours or too many threads.", "short",
                        query(f"sum by (rank, role) (rate(outrider_thread_cpu_seconds_total{{{R}}}"
                              "[$__rate_interval]))", "cpu {{role}} rank {{rank}}"),
                        query(f"sum by (rank, role) (rate(outrider_thread_run_delay_seconds_total{{{R}}}"
                              "[$__rate_interval]))", "run delay {{role}} rank {{rank}}")))
    d = d.with_panel(ts("Threads", "Threads by role, the intra-op threads torch is set to use, and the child "
                        "processes (DataLoader workers) whose threads the data_workers role counts: more runnable "
                        "threads than CPUs makes them wait.", "short",
                        query(f"sum by (rank, role) (outrider_threads{{{R}}})", "{{role}} rank {{rank}}"),
                        query(f"max by (rank) (outrider_torch_intra_op_threads{{{R}}})",
                              "torch intra-op setting rank {{rank}}"),
                        query(f"sum by (rank) (outrider_child_processes{{{R}}})", "child processes rank {{rank}}")))
    d = d.with_panel(ts("Main-thread CPU per autograd operation", "CPU seconds of the main thread per "
                        "differentiable operation: high with many operations is framework overhead (small ops), "
                        "low is the math itself.", "s",
                        query(f'sum by (rank) (rate(outrider_thread_cpu_seconds_total{{{R}, role="main"}}'
                              f"[$__rate_interval])) / sum by (rank) (rate(outrider_train_autograd_ops_total{{{R}}}"
                              "[$__rate_interval]))", "rank {{rank}}")))
    d = d.with_panel(ts("Where the loop thread is (stack samples)", "Share of the loop thread's stack samples "
                        "(hook/profiler.py) by where it was: python (the user's code), native (torch, C calls), "
                        "waiting (sleep, locks, I/O), data, collective, checkpoint, optimizer.", "percentunit",
                        query(f"sum by (rank, where) (rate(outrider_train_loop_samples_total{{{R}}}"
                              f"[$__rate_interval])) / ignoring (where) group_left sum by (rank) "
                              f"(rate(outrider_train_loop_samples_total{{{R}}}[$__rate_interval]))",
                              "{{where}} rank {{rank}}")))
    d = d.with_panel(ts("The loop's hottest lines", "Stack samples a second of the loop thread by its top frame "
                        "(the innermost line of the user's code): the lines the loop spends its time on.", "short",
                        query(f"topk(10, sum by (frame, where) (rate(outrider_train_loop_frame_samples_total{{{R}}}"
                              "[$__rate_interval])))", "{{frame}} ({{where}})")))
    d = d.with_row(Row("Throughput"))
    d = d.with_panel(ts("Samples/s and tokens/s", "Throughput per rank.", "short",
                        query(f"sum by (rank) (rate(outrider_samples_total{{{R}}}[$__rate_interval]))",
                              "samples/s rank {{rank}}"),
                        query(f"sum by (rank) (rate(outrider_tokens_total{{{R}}}[$__rate_interval]))",
                              "tokens/s rank {{rank}}"),
                        links=[runbook("degradation.md", "throughputdrop", "throughput drop")]))
    d = d.with_panel(ts("Time to first step", "Seconds from process start to the first completed step.", "s",
                        query(f"max by (rank) (outrider_train_time_to_first_step_seconds{{{R}}})", "rank {{rank}}")))
    d = d.with_row(Row("GPU"))
    d = d.with_panel(ts("GPU utilisation and SM activity", "Kernel-time utilisation (NVML) and SM activity (GPM, "
                        "Hopper+): high utilisation with low SM activity means small kernels.", "percentunit",
                        query(f'avg by (gpu) (outrider_gpu_utilization_ratio{{{G}, task="general"}})',
                              "util GPU {{gpu}}"),
                        query(f"avg by (gpu) (outrider_gpu_sm_activity_ratio{{{G}}})", "SM activity GPU {{gpu}}"),
                        min_val=0, max_val=1))
    d = d.with_panel(ts("GPU memory used / total", "Device memory in use against capacity.", "bytes",
                        query(f"sum by (gpu) (outrider_gpu_memory_used_bytes{{{G}}})", "used GPU {{gpu}}"),
                        query(f"sum by (gpu) (outrider_gpu_memory_total_bytes{{{G}}})", "total GPU {{gpu}}"),
                        links=[runbook("exhaustion.md", "gpumemorynearlyfull", "GPU memory")]))
    d = d.with_panel(ts("PyTorch allocator", "The CUDA caching allocator: allocated by tensors, reserved from the "
                        "device, and the peak.", "bytes",
                        query(f"sum by (rank, kind) (outrider_torch_cuda_memory_bytes{{{R}, "
                              f'kind=~"allocated|reserved"}})', "{{kind}} rank {{rank}}"),
                        query(f"sum by (rank) (outrider_torch_cuda_memory_peak_bytes{{{R}}})", "peak rank {{rank}}"),
                        links=[runbook("exhaustion.md", "gpuoompredicted", "OOM predicted")]))
    d = d.with_panel(ts("Allocation retries and OOMs", "cudaMalloc retries (fragmentation) and out-of-memory "
                        "errors, per rank.", "short",
                        query(f"sum by (rank) (increase(outrider_torch_cuda_alloc_retries_total{{{R}}}"
                              "[$__rate_interval]))", "retries rank {{rank}}"),
                        query(f"sum by (rank) (increase(outrider_torch_cuda_ooms_total{{{R}}}[$__rate_interval]))",
                              "OOMs rank {{rank}}"),
                        th=thresholds(GREEN, (1, "red")),
                        links=[runbook("exhaustion.md", "gpuallocatorretries", "allocator retries")]))
    d = d.with_panel(stat("Last OOM at step", "The training step during which each rank's last CUDA out-of-memory "
                          "error happened.", "short",
                          query(f"max by (rank) (outrider_torch_cuda_oom_step{{{R}}})", "rank {{rank}}", instant=True),
                          width=24, height=3, th=thresholds(GREEN, (1, "red")),
                          links=[runbook("exhaustion.md", "gpuoutofmemoryerrors", "OOM errors")]))
    d = d.with_row(Row("Processes, stalls and phases"))
    d = d.with_panel(stat("Job age", "Time since the oldest live instrumented process of the selected ranks called "
                          "instrument().", "s",
                          query(f"time() - min(outrider_train_start_timestamp_seconds{{{R}}})", instant=True)))
    d = d.with_panel(stat("Waiting for a first step", "Ranks whose processes have not completed a first step yet "
                          "(loading data, compiling, waiting for peers).", "short",
                          query(f"sum(outrider_train_first_step_pending{{{R}}})", instant=True),
                          th=thresholds(GREEN, (1, "orange"))))
    d = d.with_panel(stat("Stalled ranks", "Ranks with a process stalled or unresponsive now (their Python stacks "
                          "are in the spool).", "short", query(f"sum(outrider_hook_stalled{{{R}}})", instant=True),
                          th=thresholds(GREEN, (1, "red")),
                          links=[runbook("degradation.md", "trainingstalled", "stalled")]))
    d = d.with_panel(stat("Stopped ranks", "Ranks with a process stopped now (SIGSTOP, a job-control stop, a "
                          "debugger): not stalled; its work resumes when it is continued.", "short",
                          query(f"sum(outrider_hook_stopped{{{R}}})", instant=True),
                          th=thresholds(GREEN, (1, "orange")),
                          links=[runbook("degradation.md", "trainingstopped", "stopped")]))
    d = d.with_panel(stat("Oldest heartbeat", "Age of the stalest heartbeat among the instrumented processes (the "
                          "publisher thread writes one every flush).", "s",
                          query(f"time() - min(outrider_hook_last_heartbeat_timestamp_seconds{{{R}}})", instant=True),
                          th=thresholds(GREEN, (30, "orange"), (120, "red"))))
    d = d.with_panel(ts("Instrumented processes", "Processes publishing to the spool, by state: running, stalled (no "
                        "step within the stall threshold), unresponsive (alive, publisher silent), stopped (SIGSTOP, "
                        "job control, a debugger).", "short",
                        query(f"sum by (state) (outrider_hook_processes{{{SEL}}})", "{{state}}"),
                        th=thresholds(GREEN, (1, "orange"))))
    d = d.with_panel(ts("Declared phases", "Share of time each rank spends in its declared phases (checkpoint, "
                        "evaluation: outrider.phase), and 1 while one is open.", "percentunit",
                        query(f"sum by (rank, phase) (rate(outrider_train_phase_seconds_total{{{R}}}"
                              "[$__rate_interval]))", "{{phase}} rank {{rank}}"),
                        query(f"max by (rank, phase) (outrider_train_phase_active{{{R}}})",
                              "open: {{phase}} rank {{rank}}"), min_val=0, max_val=1))
    d = d.with_panel(ts("Checkpoints", "Recognised checkpoints (torch.save, torch.distributed.checkpoint, "
                        "safetensors on the loop's thread): mean duration of those finished in the interval, by rank.",
                        "s", query(f"sum by (rank) (rate(outrider_train_checkpoint_duration_seconds_sum{{{R}}}"
                                   "[$__rate_interval])) / sum by (rank) (rate("
                                   f"outrider_train_checkpoint_duration_seconds_count{{{R}}}[$__rate_interval]))",
                                   "rank {{rank}}")))
    d = d.with_panel(ts("Custom latencies p50 / p99", "What the job times itself (outrider.latency, @timed, "
                        "record_latency), by name.", "s",
                        *percentiles(f"outrider_latency_seconds_bucket{{{R}}}", 0.5, 0.99, by="le, name",
                                     legend=" {{name}}")))
    d = d.with_panel(ts("Diagnosis evidence", "The signals behind the bottleneck verdict over the diagnosis window "
                        "(data-wait fraction, GPU utilisation, process CPU cores, step time, ...).", "short",
                        query(f"max by (signal) (outrider_diagnosis_signal{{{SEL}}})", "{{signal}}")))
    return d
