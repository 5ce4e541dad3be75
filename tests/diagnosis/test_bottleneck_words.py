"""Each verdict's words, whole, and each threshold's line itself: the rules' tests (test_verdict_rules.py) judge
just below and just above every line; these say which side the line itself falls on, as docs/diagnosis.md words it
("above 95%", "30% or more"), and what a user reads for every branch of the rules, its evidence and its frames
carried with it. A reason is what an on-call engineer reads at night: a changed word, number format or fallback
fails here by name."""

from __future__ import annotations

import pytest

from outrider.diagnosis.bottleneck import (
    CPUS_SHORT,
    INPUT_ADVICE,
    advice,
    classify,
    input_cause,
    nothing_ran,
    workers_wait_for_cpus,
)
from outrider.diagnosis.signals import RankSignals
from tests.diagnosis.test_verdict_rules import NEAR, THRESHOLDS, cpu, gpu, ranks, resting, service

WAITING = [("waiting", "train.py:40 wait_for_peer", 0.7)]
PYTHON = [("python", "tokenise.py:12 encode", 0.6)]
CASES = {
    "idle": cpu(steps_per_s=0.0, process_cpu_cores=0.01),
    # a utilisation without a GPU counted (no device of the job's): the job has no GPU to be busy
    "idle beside a utilisation of no GPU": cpu(steps_per_s=0.0, process_cpu_cores=0.01, gpus=0, gpu_util=0.9),
    "throttled for heat": cpu(gpus=1, gpu_util=0.9, throttle_thermal=True, throttle_power=True),
    "throttled for power": cpu(gpus=1, gpu_util=0.9, throttle_power=True),
    "GPU memory full": cpu(gpu_mem_ratio=0.99),
    "one allocator retry": cpu(alloc_retries=1.0),
    "no host memory available at all": cpu(host_mem_available_ratio=0.0),
    "the container near its limit": cpu(container_mem_ratio=0.97),
    "checkpoints": cpu(checkpoint_fraction=0.4, data_wait_fraction=0.1, step_fraction=0.5),
    "checkpoints without a measured step": cpu(checkpoint_fraction=0.4),
    "checkpoints as long as the data wait": cpu(checkpoint_fraction=0.4, data_wait_fraction=0.4),
    "a starved rank": ranks(hungry_wait=6.0, others_coll=5.0),
    "a starved rank without a name or others' wait": cpu(starved=RankSignals("job", "", 10, 0.1, 0.0, 0.2, 0.0, 0.6)),
    "workers waiting for storage": cpu(data_wait_fraction=0.6, data_worker_busy=0.1, storage_read_bytes_per_s=12.3e6,
                                       io_pressure_fraction=0.2),
    "workers waiting for storage that reads nothing": cpu(data_wait_fraction=0.6, data_worker_busy=0.1),
    "workers decoding": cpu(data_wait_fraction=0.6, data_worker_busy=0.9, data_workers_cpu_cores=3.5,
                            storage_read_bytes_per_s=2.5e6),
    "workers decoding, nothing read, cores unmeasured": cpu(data_wait_fraction=0.6, data_worker_busy=0.9),
    "workers' cores only": cpu(data_wait_fraction=0.6, data_workers_cpu_cores=2.0),
    "no workers measured": cpu(data_wait_fraction=0.6),
    "waits on its own time": cpu(data_wait_fraction=0.2, data_wait_alone_fraction=0.5),
    # 0.45 + 0.05 is 0.5 exactly: at the line the reason gives the measured wait alone
    "waits on its own time, by 0.05 exactly": cpu(data_wait_fraction=0.45, data_wait_alone_fraction=0.5),
    "waits on its own time, by more than 0.05": cpu(data_wait_fraction=0.45, data_wait_alone_fraction=0.51),
    "waits on its own time, none measured on the wall": cpu(data_wait_alone_fraction=0.5),
    "a straggler": ranks(slow_compute=2.0),
    "a straggler without a name": cpu(straggler=RankSignals("job", "", 10, 0.2, 0.0, 0.2, 0.0)),
    "collectives on every rank": cpu(collective_wait_fraction=0.4, data_wait_fraction=0.05),
    "DRAM bandwidth": gpu(gpu_busy_ratio=0.5, dram_activity=0.8, sm_activity=0.3),
    "at rest, waiting at a line": resting(top_frames=WAITING),
    "at rest, no pool measured": resting(intra_op_busy=None, loop_samples=500.0,
                                         profile={"waiting": 0.8, "native": 0.2}),
    "at rest beside a GPU's use": resting(gpus=1, gpu_util=0.02, main_thread_cpu=0.05),
    "at rest beside busy threads of its own": resting(other_threads_busy=0.8),
    "at rest, at the waiting line": resting(loop_waiting_fraction=0.5),
    "a service waiting downstream": service(),
    "a service waiting behind a queue": service(request_queue_s=0.02),
    "a service on its CPU": service(request_cpu_s=0.03, request_cpu_wait_s=0.01, request_waiting_fraction=0.2,
                                    demand_per_process=0.8),
    "a service at the waiting line": service(request_waiting_fraction=0.5),
    "a service, requests held": service(requests_per_s=0.0, requests_in_flight=4.0, request_latency_s=None),
    "a service, requests worked on": service(requests_per_s=0.0, requests_in_flight=4.0, request_latency_s=None,
                                             request_waiting_fraction=0.2, demand_per_process=0.9),
    "a service on a busy GPU": service(request_waiting_fraction=0.2, gpus=1, gpu_util=0.9),
    # measured zeros are numbers, not missing ones: each is said as 0, never as a fallback
    "a GPU never busy": gpu(gpu_busy_ratio=0.0),
    "no steps, a GPU never busy": gpu(gpu_busy_ratio=0.0, steps_per_s=0.0),
    "a service answering at once": service(request_latency_s=0.0),
    "a service, requests held, none off CPU": service(requests_per_s=0.0, requests_in_flight=4.0,
                                                      request_latency_s=None, request_waiting_fraction=0.0),
    "a service, requests held, its threads idle": service(requests_per_s=0.0, requests_in_flight=4.0,
                                                          request_latency_s=None, demand_per_process=0.0),
    "a service on its CPU, none of it off CPU": service(request_cpu_s=0.05, request_waiting_fraction=0.0),
    "CPU, the main thread idle beside an idle pool": cpu(main_thread_busy=0.0, intra_op_busy=0.0),
    "CPU, the pool never busy": cpu(intra_op_busy=0.0),
    # its GPU paces no steps: busy "of the time"
    "a service on an idling GPU": service(request_waiting_fraction=0.2, gpus=1, gpu_util=0.05),
    # host memory exactly at its line is not short: only the GPU's memory is said
    "GPU memory full, host memory at its line": cpu(gpu_mem_ratio=0.99, host_mem_available_ratio=0.05),
    "a service, one long request in flight": service(requests_per_s=0.0, requests_in_flight=1.0,
                                                     request_latency_s=None, process_cpu_cores=0.0),
    "a service, requests held beside a GPU": service(requests_per_s=0.0, requests_in_flight=4.0,
                                                     request_latency_s=None, request_waiting_fraction=0.2, gpus=1,
                                                     gpu_util=0.9),
    "workers starved of CPU": cpu(data_wait_fraction=0.6, data_worker_busy=0.8, data_workers_cpu_cores=0.07,
                                  data_workers_delay_cores=1.6, data_worker_delay_fraction=0.8,
                                  storage_read_bytes_per_s=8e4),
    "workers starved of CPU, reads unmeasured": cpu(data_wait_fraction=0.6, data_worker_busy=0.8,
                                                    data_workers_delay_cores=1.6, data_worker_delay_fraction=0.8),
    "workers decoding, waiting for a CPU as long": cpu(data_wait_fraction=0.6, data_worker_busy=0.9,
                                                      data_workers_cpu_cores=1.0, data_workers_delay_cores=1.0,
                                                      data_worker_delay_fraction=0.25),
    "workers waiting elsewhere": cpu(data_wait_fraction=0.6, data_worker_busy=0.1, storage_read_bytes_per_s=0.0,
                                     io_pressure_fraction=0.01),
    "the loop's thread waiting for storage": cpu(data_wait_fraction=0.6, main_thread_busy=0.1,
                                                 io_pressure_fraction=0.3),
    "the loop's thread loading": cpu(data_wait_fraction=0.6, main_thread_busy=0.7),
    "workers' cores, threads unmeasured": cpu(data_wait_fraction=0.6, main_thread_busy=None,
                                              data_workers_cpu_cores=1.0),
    "GPU memory and host memory short": gpu(gpu_mem_ratio=0.97, alloc_retries=3.0, host_mem_available_ratio=0.02),
    # each trigger of memory_pressure named only when it is met
    "one retry, GPU memory at its line": cpu(gpu_mem_ratio=0.95, alloc_retries=1.0),
    "one retry, host memory plentiful": cpu(alloc_retries=1.0, host_mem_available_ratio=0.5),
    "a GPU loop waiting for data": gpu(gpu_busy_ratio=0.1, data_wait_fraction=0.6),
    "at rest, a step every two seconds": resting(steps_per_s=0.5),
    "at rest, its thread unmeasured": resting(main_thread_busy=None),
    "no steps, a loop share left over": cpu(steps_per_s=0.0, process_cpu_cores=0.5, loop_waiting_fraction=0.9),
    "waiting beside contention": resting(run_delay_fraction=0.5),
    "GPU compute, a step every two seconds": gpu(gpu_busy_ratio=0.8, steps_per_s=0.5),
    "workers decoding, their share waiting unmeasured": cpu(data_wait_fraction=0.6, data_worker_busy=0.9,
                                                           data_workers_cpu_cores=0.1, data_workers_delay_cores=0.5),
    "workers starved, their CPU unmeasured": cpu(data_wait_fraction=0.6, data_worker_busy=0.9,
                                                 data_workers_delay_cores=0.5, data_worker_delay_fraction=0.8),
    "no per-thread CPU, no workers": cpu(data_wait_fraction=0.6, main_thread_busy=None),
    "the loop's thread loading at the saturated line": cpu(data_wait_fraction=0.6, main_thread_busy=0.6),
    "a service, its demand unmeasured": service(demand_per_process=None, request_waiting_fraction=0.2),
    "a service, its CPU per request unmeasured": service(request_cpu_s=None),
    "a service, nothing finished nor in flight counted": service(request_latency_s=None, requests_in_flight=None),
    "a service, requests held at the waiting line": service(requests_per_s=0.0, requests_in_flight=4.0,
                                                            request_latency_s=None, request_waiting_fraction=0.5),
    "Python-bound at a line": cpu(main_cpu_us_per_op=900.0, loop_samples=1000.0,
                                  profile={"python": 0.6, "native": 0.4}, top_frames=PYTHON),
    "Python-bound, no frame": cpu(main_cpu_us_per_op=900.0, loop_samples=1000.0,
                                  profile={"python": 0.6, "native": 0.4}),
    "GPU compute, CUDA events": gpu(gpu_busy_ratio=0.8),
    "GPU compute, NVML": cpu(gpus=1, gpu_util=0.8),
    "GPU waits for the host": gpu(gpu_busy_ratio=0.2),
    "GPU busy, no steps": gpu(steps_per_s=0.0, gpu_busy_ratio=0.5),
    "GPU balanced": gpu(gpu_busy_ratio=0.45),
    "CPU, no steps": cpu(steps_per_s=0.0, process_cpu_cores=0.5),
    "CPU, process cores only": cpu(main_thread_busy=None, intra_op_busy=None, process_cpu_cores=2.0),
    "CPU, process cores only, few": cpu(main_thread_busy=None, intra_op_busy=None, process_cpu_cores=1.0),
    "CPU, the pool unmeasured": cpu(intra_op_busy=None, process_cpu_cores=2.0),
    "CPU, ops spinning at barriers": cpu(main_cpu_us_per_op=2000.0, intra_op_threads=2.0, intra_op_busy=0.1,
                                         ops_per_step=120.0),
    "CPU, large ops": cpu(main_cpu_us_per_op=900.0, ops_per_step=120.0, intra_op_busy=1.2),
    "CPU, large ops uncounted per step": cpu(main_cpu_us_per_op=900.0),
    "CPU, small ops": cpu(main_cpu_us_per_op=50.0, ops_per_step=300.0, main_thread_busy=0.95),
    "CPU, middling ops": cpu(main_cpu_us_per_op=300.0, ops_per_step=40.0),
    "CPU, ops counted, none at both ends": cpu(ops_counted=True),
    "CPU, the pool busy": cpu(main_thread_busy=0.9, intra_op_busy=1.5),
    "CPU, one intra-op thread": cpu(main_thread_busy=0.9, intra_op_busy=0.05, intra_op_threads=1.0),
    "CPU, four intra-op threads idle": cpu(main_thread_busy=0.9, intra_op_busy=0.05, intra_op_threads=4.0),
    "CPU, nothing dominates": cpu(main_thread_busy=0.5, intra_op_busy=0.1),
    "contended": cpu(main_cpu_us_per_op=50.0, run_delay_fraction=0.3),
    # the lines inside the rules, each met exactly (the thresholds' own rows judge 2% either side)
    "at rest, no pool or samples measured": resting(intra_op_busy=None),
    "at rest but the pool at its line": resting(intra_op_busy=0.2),
    "at rest beside an idle GPU": resting(gpus=1, gpu_util=0.01),
    "at rest beside a GPU at the idle line": resting(gpus=1, gpu_util=0.05),
    "a loop waiting at a GPU's pace": resting(gpus=1, gpu_util=0.5, loop_waiting_fraction=0.4),
    "CPU, process cores only, waiting for data at the fed line": cpu(main_thread_busy=None, intra_op_busy=None,
                                                                     process_cpu_cores=2.0, data_wait_fraction=0.1),
    "CPU, ops of 500 us spinning": cpu(main_cpu_us_per_op=500.0, intra_op_threads=2.0, intra_op_busy=0.1),
    "CPU, ops of 100 ms each": cpu(main_cpu_us_per_op=100_000.0),
    "CPU, ops of 100 ms spinning": cpu(main_cpu_us_per_op=100_000.0, intra_op_threads=2.0, intra_op_busy=0.1),
    "CPU, ops counted, none at both ends, main at the line": cpu(ops_counted=True, main_thread_busy=0.5),
    "CPU, the pool idle, waiting for data at the fed line": cpu(main_thread_busy=0.9, intra_op_busy=0.05,
                                                                data_wait_fraction=0.1),
    "workers waiting for a storage array at 60 GB/s": cpu(data_wait_fraction=0.6, data_worker_busy=0.1,
                                                          storage_read_bytes_per_s=60e9),
    "idle beside contention": cpu(steps_per_s=0.0, process_cpu_cores=0.01, run_delay_fraction=0.5),
    "not judged beside contention": cpu(steps_per_s=0.0, process_cpu_cores=0.5, run_delay_fraction=0.5),
}

EXPECTED = {
    'a GPU never busy': ('host_bound',
        'the GPU waits for the host (CUDA events: the GPU paced only 0% of the steps): Python, kernel launches or '
        'small operations pace the job'),
    'no steps, a GPU never busy': ('not_judged', 'no steps or requests; CUDA events: the GPU paced 0% of the time'),
    'a service answering at once': ('waiting',
        "handlers wait: 0 s per request (mean latency), 1 ms of CPU and 0 s waiting for a CPU per request; 98% of the "
        "requests' time off CPU, outside the process (a downstream call, the network, a lock, a sleep)"),
    'a service, requests held, none off CPU': ('not_judged',
        '4 requests in flight and none finished in the window: no latency to split'),
    'a service, requests held, its threads idle': ('waiting',
        "4 requests in flight and none finished in the window, the process's threads busy 0 cores: its handlers "
        "wait outside the process (a downstream call, the network, a lock, a sleep)"),
    'a service on its CPU, none of it off CPU': ('compute_bound',
        "the requests' time is CPU: 50 ms per request (mean latency), 50 ms of CPU and 0 s waiting for a CPU per "
        "request, the process's threads busy 0.04 cores (0% of the requests' time outside the process)"),
    'CPU, the main thread idle beside an idle pool': ('balanced',
        'main thread 0% demand, intra-op pool 0.00: no single bottleneck'),
    'CPU, the pool never busy': ('host_bound',
        'the main thread is saturated (90% demand) while the intra-op pool idles (0.00): Python and dispatch pace '
        'the job'),
    'a service on an idling GPU': ('host_bound',
        'the GPU waits for the host (NVML: the GPU was busy only 5% of the time): Python, kernel launches or small '
        'operations pace the job'),
    'GPU memory full, host memory at its line': ('memory_pressure', 'GPU memory at 99% of its capacity (above 95%)'),
    'a service, one long request in flight': ('waiting',
        "1 request in flight and none finished in the window, the process's threads busy 0.04 cores: its handlers "
        "wait outside the process (a downstream call, the network, a lock, a sleep)"),
    'idle': ('idle',
        'no steps or requests, no CPU or GPU use'),
    'idle beside a utilisation of no GPU': ('idle',
        'no steps or requests, no CPU or GPU use'),
    'throttled for heat': ('throttled',
        'thermal clock event reasons active on a busy GPU'),
    'throttled for power': ('throttled',
        'power clock event reasons active on a busy GPU'),
    'GPU memory full': ('memory_pressure',
        'GPU memory at 99% of its capacity (above 95%)'),
    'one allocator retry': ('memory_pressure',
        '1 allocator retry'),
    'no host memory available at all': ('memory_pressure',
        'host memory available 0% (below 5%)'),
    'the container near its limit': ('memory_pressure',
        "the container's working set at 97% of its memory limit: the kernel reclaims and will OOM-kill before the"
        ' host runs out'),
    'checkpoints': ('checkpoint_bound',
        "40% of the loop's time in checkpoints (torch.save and the like on the loop's thread), the step's work "
        '50%'),
    'checkpoints without a measured step': ('checkpoint_bound',
        "40% of the loop's time in checkpoints (torch.save and the like on the loop's thread), the step's work 0%"),
    'checkpoints as long as the data wait': ('checkpoint_bound',
        "40% of the loop's time in checkpoints (torch.save and the like on the loop's thread), the step's work 0%"),
    'a starved rank': ('input_bound',
        'rank 1 is starved by its DataLoader: 60% of its loop waiting for data, while the other ranks spend 50% '
        'of theirs waiting for it in collectives; the DataLoader workers (each busy 0% of the time) wait off CPU,'
        ' and not for storage (storage reads not measured): the network, a remote store, a lock or a sleep in the'
        ' loader'),
    "a starved rank without a name or others' wait": ('input_bound',
        'rank - is starved by its DataLoader: 60% of its loop waiting for data, while the other ranks spend 0% of'
        " theirs waiting for it in collectives; the data pipeline's CPU: the loader works on the loop's thread "
        '(no DataLoader workers; busy 90% of the time)'),
    'workers waiting for storage': ('input_bound',
        '60% of the loop waiting for data; the DataLoader workers (each busy 10% of the time) wait for storage: '
        '11.7 MiB/s read from storage, I/O pressure on the host 20%'),
    'workers waiting for storage that reads nothing': ('input_bound',
        '60% of the loop waiting for data; the DataLoader workers (each busy 10% of the time) wait off CPU, and '
        'not for storage (storage reads not measured): the network, a remote store, a lock or a sleep in the '
        'loader'),
    'workers decoding': ('input_bound',
        "60% of the loop waiting for data; the data pipeline's CPU: the DataLoader workers decode, each busy 90% "
        'of the time (3.5 cores; 2.38 MiB/s read from storage)'),
    'workers decoding, nothing read, cores unmeasured': ('input_bound',
        "60% of the loop waiting for data; the data pipeline's CPU: the DataLoader workers decode, each busy 90% "
        'of the time (0 cores; storage reads not measured)'),
    "workers' cores only": ('input_bound',
        '60% of the loop waiting for data, DataLoader workers 2 cores'),
    'no workers measured': ('input_bound',
        "60% of the loop waiting for data; the data pipeline's CPU: the loader works on the loop's thread (no "
        'DataLoader workers; busy 90% of the time)'),
    'waits on its own time': ('input_bound',
        '20% of the loop waiting for data (50% of its own time, less the time its thread waited for a CPU); the '
        "data pipeline's CPU: the loader works on the loop's thread (no DataLoader workers; busy 90% of the time)"),
    'waits on its own time, by 0.05 exactly': ('input_bound',
        "45% of the loop waiting for data; the data pipeline's CPU: the loader works on the loop's thread (no "
        'DataLoader workers; busy 90% of the time)'),
    'waits on its own time, by more than 0.05': ('input_bound',
        '45% of the loop waiting for data (51% of its own time, less the time its thread waited for a CPU); the '
        "data pipeline's CPU: the loader works on the loop's thread (no DataLoader workers; busy 90% of the time)"),
    'waits on its own time, none measured on the wall': ('input_bound',
        '0% of the loop waiting for data (50% of its own time, less the time its thread waited for a CPU); the '
        "data pipeline's CPU: the loader works on the loop's thread (no DataLoader workers; busy 90% of the time)"),
    'a straggler': ('communication_bound',
        "rank 2 is a straggler: its compute per step is 2.0x the other ranks', which spend 71% of their loop "
        'waiting for it in collectives'),
    'a straggler without a name': ('communication_bound',
        "rank - is a straggler: its compute per step is 0.0x the other ranks', which spend 0% of their loop "
        'waiting for it in collectives'),
    'collectives on every rank': ('communication_bound',
        '40% of the loop blocked in collectives, evenly across ranks (no straggler)'),
    'DRAM bandwidth': ('memory_bandwidth_bound',
        'DRAM bandwidth high while SMs are not'),
    'at rest, waiting at a line': ('waiting',
        "the loop waits outside the process: its thread off CPU 90% of the loop's time beside data, collectives "
        "and checkpoints (busy 10%, 0 cores of CPU; torch's pool 0.02), mostly at train.py:40 wait_for_peer"),
    'at rest, no pool measured': ('waiting',
        "the loop waits outside the process: its thread off CPU 90% of the loop's time beside data, collectives "
        "and checkpoints (busy 10%, 0 cores of CPU; torch's pool 0.00)"),
    "at rest beside a GPU's use": ('waiting',
        "the loop waits outside the process: its thread off CPU 90% of the loop's time beside data, collectives, "
        "checkpoints and the GPU (busy 10%, 0.05 cores of CPU; torch's pool 0.02)"),
    'at rest beside busy threads of its own': ('balanced',
        'main thread 10% demand, intra-op pool 0.02: no single bottleneck'),
    'at rest, at the waiting line': ('balanced',
        'main thread 10% demand, intra-op pool 0.02: no single bottleneck'),
    'a service waiting downstream': ('waiting',
        'handlers wait: 50 ms per request (mean latency), 1 ms of CPU and 0 s waiting for a CPU per request; 98% '
        "of the requests' time off CPU, outside the process (a downstream call, the network, a lock, a sleep)"),
    'a service waiting behind a queue': ('waiting',
        'handlers wait: 50 ms per request (mean latency), 1 ms of CPU and 0 s waiting for a CPU per request, 20 '
        "ms of it queued; 98% of the requests' time off CPU, outside the process (a downstream call, the network,"
        ' a lock, a sleep)'),
    'a service on its CPU': ('compute_bound',
        "the requests' time is CPU: 50 ms per request (mean latency), 30 ms of CPU and 10 ms waiting for a CPU "
        "per request, the process's threads busy 0.8 cores (20% of the requests' time outside the process)"),
    'a service at the waiting line': ('compute_bound',
        "the requests' time is CPU: 50 ms per request (mean latency), 1 ms of CPU and 0 s waiting for a CPU per "
        "request, the process's threads busy 0.04 cores (50% of the requests' time outside the process)"),
    'a service, requests held': ('waiting',
        "4 requests in flight and none finished in the window, the process's threads busy 0.04 cores: its "
        'handlers wait outside the process (a downstream call, the network, a lock, a sleep)'),
    'a service, requests worked on': ('not_judged',
        '4 requests in flight and none finished in the window: no latency to split'),
    'a service on a busy GPU': ('compute_bound',
        'NVML: the GPU was busy 90% of the time'),
    'a service, requests held beside a GPU': ('compute_bound',
        'NVML: the GPU was busy 90% of the time'),
    'workers starved of CPU': ('input_bound',
        '60% of the loop waiting for data; the DataLoader workers are starved of CPU: 1.60 s a second waiting for'
        ' a CPU and 0.07 s on one, each worker 80% of the time waiting (78.1 KiB/s read from storage)'),
    'workers starved of CPU, reads unmeasured': ('input_bound',
        '60% of the loop waiting for data; the DataLoader workers are starved of CPU: 1.60 s a second waiting for'
        ' a CPU and 0.00 s on one, each worker 80% of the time waiting (storage reads not measured)'),
    'workers decoding, waiting for a CPU as long': ('input_bound',
        "60% of the loop waiting for data; the data pipeline's CPU: the DataLoader workers decode, each busy 90% "
        'of the time (1 core; storage reads not measured); they also wait for a CPU (1.00 s a second waiting for '
        'a CPU and 1.00 s on one, each worker 25% of the time waiting)'),
    'workers waiting elsewhere': ('input_bound',
        '60% of the loop waiting for data; the DataLoader workers (each busy 10% of the time) wait off CPU, and '
        'not for storage (0 B/s read from storage, I/O pressure on the host 1%): the network, a remote store, a '
        'lock or a sleep in the loader'),
    "the loop's thread waiting for storage": ('input_bound',
        "60% of the loop waiting for data; the loop's thread (no DataLoader workers; busy 10% of the time) waits "
        'for storage: storage reads not measured, I/O pressure on the host 30%'),
    "the loop's thread loading": ('input_bound',
        "60% of the loop waiting for data; the data pipeline's CPU: the loader works on the loop's thread (no "
        'DataLoader workers; busy 70% of the time)'),
    "workers' cores, threads unmeasured": ('input_bound',
        '60% of the loop waiting for data, DataLoader workers 1 core'),
    'GPU memory and host memory short': ('memory_pressure',
        'GPU memory at 97% of its capacity (above 95%), 3 allocator retries, host memory available 2% (below 5%)'),
    'one retry, GPU memory at its line': ('memory_pressure',
        '1 allocator retry'),
    'one retry, host memory plentiful': ('memory_pressure',
        '1 allocator retry'),
    'a GPU loop waiting for data': ('input_bound',
        "60% of the loop waiting for data, accelerator underused; the data pipeline's CPU: the loader works on "
        "the loop's thread (no DataLoader workers; busy 90% of the time)"),
    'at rest, a step every two seconds': ('waiting',
        "the loop waits outside the process: its thread off CPU 90% of the loop's time beside data, collectives "
        "and checkpoints (busy 10%, 0 cores of CPU; torch's pool 0.02)"),
    'at rest, its thread unmeasured': ('waiting',
        "the loop waits outside the process: its thread off CPU 90% of the loop's time beside data, collectives "
        "and checkpoints (busy 0%, 0 cores of CPU; torch's pool 0.02)"),
    'no steps, a loop share left over': ('not_judged',
        'no steps or requests in this window: no loop to judge'),
    'waiting beside contention': ('waiting',
        "the loop waits outside the process: its thread off CPU 90% of the loop's time beside data, collectives "
        "and checkpoints (busy 10%, 0 cores of CPU; torch's pool 0.02)"),
    'GPU compute, a step every two seconds': ('compute_bound',
        'CUDA events: the GPU paced 80% of the steps'),
    'workers decoding, their share waiting unmeasured': ('input_bound',
        "60% of the loop waiting for data; the data pipeline's CPU: the DataLoader workers decode, each busy 90% "
        'of the time (0.1 cores; storage reads not measured); they also wait for a CPU (0.50 s a second waiting '
        'for a CPU and 0.10 s on one, each worker 0% of the time waiting)'),
    'workers starved, their CPU unmeasured': ('input_bound',
        '60% of the loop waiting for data; the DataLoader workers are starved of CPU: 0.50 s a second waiting for'
        ' a CPU and 0.00 s on one, each worker 80% of the time waiting (storage reads not measured)'),
    'no per-thread CPU, no workers': ('input_bound',
        '60% of the loop waiting for data'),
    "the loop's thread loading at the saturated line": ('input_bound',
        "60% of the loop waiting for data; the data pipeline's CPU: the loader works on the loop's thread (no "
        'DataLoader workers; busy 60% of the time)'),
    'a service, its demand unmeasured': ('compute_bound',
        "the requests' time is CPU: 50 ms per request (mean latency), 1 ms of CPU and 0 s waiting for a CPU per "
        "request, the process's threads busy 0 cores (20% of the requests' time outside the process)"),
    'a service, its CPU per request unmeasured': ('waiting',
        'handlers wait: 50 ms per request (mean latency), 0 s of CPU and 0 s waiting for a CPU per request; 98% '
        "of the requests' time off CPU, outside the process (a downstream call, the network, a lock, a sleep)"),
    'a service, nothing finished nor in flight counted': ('waiting',
        "0 requests in flight and none finished in the window, the process's threads busy 0.04 cores: its "
        'handlers wait outside the process (a downstream call, the network, a lock, a sleep)'),
    'a service, requests held at the waiting line': ('not_judged',
        '4 requests in flight and none finished in the window: no latency to split'),
    'Python-bound at a line': ('python_bound',
        "60% of the loop thread's samples in the user's Python code; the hottest line: tokenise.py:12 encode (60%"
        ' of the samples)'),
    'Python-bound, no frame': ('python_bound',
        "60% of the loop thread's samples in the user's Python code"),
    'GPU compute, CUDA events': ('compute_bound',
        'CUDA events: the GPU paced 80% of the steps'),
    'GPU compute, NVML': ('compute_bound',
        'NVML: the GPU was busy 80% of the steps'),
    'GPU waits for the host': ('host_bound',
        'the GPU waits for the host (CUDA events: the GPU paced only 20% of the steps): Python, kernel launches '
        'or small operations pace the job'),
    'GPU busy, no steps': ('not_judged',
        'no steps or requests; CUDA events: the GPU paced 50% of the time'),
    'GPU balanced': ('balanced',
        'CUDA events: the GPU paced 45% of the steps: neither GPU nor host dominates'),
    'CPU, no steps': ('not_judged',
        'no steps or requests in this window: no loop to judge'),
    'CPU, process cores only': ('compute_bound',
        '2.0 CPU cores busy with the work'),
    'CPU, process cores only, few': ('not_judged',
        'no per-thread CPU measurements in this window to tell host from compute'),
    'CPU, the pool unmeasured': ('compute_bound',
        '2.0 CPU cores busy with the work'),
    'CPU, ops spinning at barriers': ('not_judged',
        "120 operations per step, 2.0 ms of main-thread CPU each, but torch's pool idles (0.10 beside 0.90): the "
        "CPU per operation is not the math's (spinning at the pool's barriers, on a crowded machine)"),
    'CPU, large ops': ('compute_bound',
        "120 operations per step, 0.9 ms of main-thread CPU each: the operations' math dominates (intra-op pool "
        'demand 1.2)'),
    'CPU, large ops uncounted per step': ('compute_bound',
        "0.9 ms of main-thread CPU each: the operations' math dominates (intra-op pool demand 0.1)"),
    'CPU, small ops': ('host_bound',
        'the main thread is saturated (95% demand) with 300 operations per step, 50 us of CPU each: Python and '
        'framework overhead pace the job, the intra-op pool has no real work'),
    'CPU, middling ops': ('balanced',
        '40 operations per step, 300 us of main-thread CPU each: neither framework overhead nor the math '
        'dominates'),
    'CPU, ops counted, none at both ends': ('not_judged',
        'operations are counted but none at both ends of this window'),
    'CPU, the pool busy': ('compute_bound',
        "torch's intra-op pool is busy: 1.5 threads' worth of demand beside the main thread's 0.9"),
    'CPU, one intra-op thread': ('host_bound',
        'the main thread is saturated (90% demand) while the intra-op pool idles (0.05): Python and dispatch pace'
        ' the job (torch uses one intra-op thread: its operations run on the main thread too; '
        'torch.set_num_threads)'),
    'CPU, four intra-op threads idle': ('host_bound',
        'the main thread is saturated (90% demand) while the intra-op pool idles (0.05): Python and dispatch pace'
        ' the job'),
    'CPU, nothing dominates': ('balanced',
        'main thread 50% demand, intra-op pool 0.10: no single bottleneck'),
    'contended': ('host_bound',
        'the main thread is saturated (90% demand) with 50 us of CPU each: Python and framework overhead pace the'
        ' job, the intra-op pool has no real work; slowed by CPU contention: its threads waited for a CPU 30% of '
        'the time they were runnable (neighbours on the machine, or more threads than cores)'),
    'at rest, no pool or samples measured': ('waiting',
        "the loop waits outside the process: its thread off CPU 90% of the loop's time beside data, collectives "
        "and checkpoints (busy 10%, 0 cores of CPU; torch's pool 0.00)"),
    'at rest but the pool at its line': ('balanced',
        'main thread 10% demand, intra-op pool 0.20: no single bottleneck'),
    'at rest beside an idle GPU': ('waiting',
        "the loop waits outside the process: its thread off CPU 90% of the loop's time beside data, collectives, "
        "checkpoints and the GPU (busy 10%, 0 cores of CPU; torch's pool 0.02)"),
    'at rest beside a GPU at the idle line': ('waiting',
        "the loop waits outside the process: its thread off CPU 90% of the loop's time beside data, collectives, "
        "checkpoints and the GPU (busy 10%, 0 cores of CPU; torch's pool 0.02)"),
    "a loop waiting at a GPU's pace": ('balanced',
        'NVML: the GPU was busy 50% of the steps: neither GPU nor host dominates'),
    'CPU, process cores only, waiting for data at the fed line': ('not_judged',
        'no per-thread CPU measurements in this window to tell host from compute'),
    'CPU, ops of 500 us spinning': ('not_judged',
        "0.5 ms of main-thread CPU each, but torch's pool idles (0.10 beside 0.90): the CPU per operation is not "
        "the math's (spinning at the pool's barriers, on a crowded machine)"),
    'CPU, ops of 100 ms each': ('compute_bound',
        "100.0 ms of main-thread CPU each: the operations' math dominates (intra-op pool demand 0.1)"),
    'CPU, ops of 100 ms spinning': ('not_judged',
        "100.0 ms of main-thread CPU each, but torch's pool idles (0.10 beside 0.90): the CPU per operation is "
        "not the math's (spinning at the pool's barriers, on a crowded machine)"),
    'CPU, ops counted, none at both ends, main at the line': ('not_judged',
        'operations are counted but none at both ends of this window'),
    'CPU, the pool idle, waiting for data at the fed line': ('balanced',
        'main thread 90% demand, intra-op pool 0.05: no single bottleneck'),
    'workers waiting for a storage array at 60 GB/s': ('input_bound',
        '60% of the loop waiting for data; the DataLoader workers (each busy 10% of the time) wait for storage: '
        '55.9 GiB/s read from storage'),
    'idle beside contention': ('idle',
        'no steps or requests, no CPU or GPU use'),
    'not judged beside contention': ('not_judged',
        'no steps or requests in this window: no loop to judge'),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_branch_says_its_class_and_reason_whole_and_carries_its_evidence_and_frames(name: str) -> None:
    s = CASES[name]
    v = classify(s)
    assert (v.cls, v.reason) == EXPECTED[name]
    assert v.evidence == s.evidence()
    assert v.frames == tuple(s.top_frames)


def test_the_frames_of_the_window_are_carried_in_order() -> None:
    s = cpu(main_cpu_us_per_op=50.0, top_frames=[*PYTHON, *WAITING])
    assert classify(s).frames == (PYTHON[0], WAITING[0])


# Which side of its line each threshold of THRESHOLDS falls on at the line itself: "below" where the rule says
# "more than" or "under", "above" where it says "or more" / "at least" (docs/diagnosis.md's words), by row; a
# class where another rule's line is met at the same value
AT_THE_LINE = {
    "IDLE_CORES-0": "above", "IDLE_GPU-1": "above", "GPU_MEMORY-3": "below",
    # a GPU busy 30% with a clock event is not throttled ("above 30%"); at that line GPU_IDLE's is met too, and a GPU
    # pacing 30% of the steps is no longer waiting for the host: balanced, neither side's verdict
    "THROTTLED_BUSY-2": "balanced",
    "HOST_MEMORY-4": "above", "CONTAINER_MEMORY-5": "below", "CHECKPOINT_SHARE-6": "above", "INPUT_WAIT-7": "below",
    "COMM_WAIT-8": "above", "DRAM_BUSY-9": "above", "SM_BUSY-10": "above",
    # waiting is "more than half" the time off CPU: half exactly is not (a loop's, a service's)
    "WAITING_SHARE-11": "below", "WAITING_SHARE-12": "below", "POOL_RESTING-13": "above",
    "RESTING_SHARE-14": "above", "OTHER_BUSY-15": "above", "PYTHON_SHARE-16": "above", "GPU_BUSY-17": "above",
    "GPU_IDLE-18": "above", "FED-19": "above", "FED-20": "above", "OPS_MAIN-21": "above", "MAIN_SATURATED-22": "above",
    "MAIN_SATURATED-23": "above", "MAIN_SATURATED-24": "above", "POOL_BUSY-25": "above", "POOL_IDLE-26": "above",
    "POOL_IDLE-27": "above", "HOST_OP_US-28": "below", "COMPUTE_OP_US-29": "above",
    "PROCESS_COMPUTE_CORES-30": "above", "WORKERS_WAITING-31": "above", "WORKERS_STARVED-32": "above",
    "WORKERS_DELAYED-33": "above", "STORAGE_PRESSURE-34": "above", "STORAGE_READ-35": "above",
    "CONTENDED-37": "above",
}
ROWS = {f"{t[1]}-{i}": t for i, t in enumerate(THRESHOLDS)}


def test_every_rule_threshold_says_where_its_line_falls() -> None:
    """The straggler's and the starved rank's lines are met by ratios of measured times, which no float lands on
    exactly: those keep their 2% either side."""
    assert set(AT_THE_LINE) == {k for k, t in ROWS.items() if t[0].__name__.endswith("bottleneck")}


@pytest.mark.parametrize("row", list(AT_THE_LINE))
def test_at_the_line_itself_the_verdict_is_on_its_documented_side(row: str) -> None:
    _, _, value, line, outcome, below, above = ROWS[row]
    assert NEAR == 0.02
    side = AT_THE_LINE[row]
    assert outcome(value * line) == {"below": below, "above": above}.get(side, side)


# The lines that other rules share: GPU_BUSY decides input_bound, the starved rank and python_bound too (the GPU
# pacing 60% of the steps or more is compute_bound whatever else)
SHARED_LINES = {
    "input_bound": lambda x: cpu(gpus=1, gpu_util=0.5, gpu_busy_ratio=x, data_wait_fraction=0.6),
    "starved": lambda x: cpu(gpus=1, gpu_util=0.5, gpu_busy_ratio=x,
                             starved=RankSignals("job", "1", 10, 0.1, 0.0, 0.2, 0.0, 0.6)),
    "python_bound": lambda x: cpu(gpus=1, gpu_util=0.5, gpu_busy_ratio=x, loop_samples=1000.0,
                                  profile={"python": 0.6, "native": 0.4}),
}


@pytest.mark.parametrize("rule", list(SHARED_LINES))
def test_the_gpu_pacing_sixty_percent_of_the_steps_is_compute_bound_before_any_other_rule(rule: str) -> None:
    make = SHARED_LINES[rule]
    below = classify(make(0.6 * (1 - NEAR))).cls
    assert below == ("python_bound" if rule == "python_bound" else "input_bound")
    assert [classify(make(x)).cls for x in (0.6, 0.6 * (1 + NEAR))] == ["compute_bound", "compute_bound"]


def test_one_step_or_request_a_few_seconds_is_active() -> None:
    assert classify(cpu(steps_per_s=0.5, main_cpu_us_per_op=50.0)).cls == "host_bound"
    assert classify(cpu(steps_per_s=0.0, requests_per_s=0.5, main_cpu_us_per_op=50.0)).cls == "host_bound"


@pytest.mark.parametrize("name", list(CASES))
def test_a_runs_record_counts_as_idle_exactly_the_windows_called_idle(name: str) -> None:
    """nothing_ran (what a run's record leaves out of its active time) is the idle rule itself."""
    assert nothing_ran(CASES[name]) == (classify(CASES[name]).cls == "idle")


def test_the_advice_for_a_loop_waiting_on_its_input_is_its_causes_alone_when_cpus_are_not_short() -> None:
    s = cpu(data_wait_fraction=0.6, data_worker_busy=0.1, storage_read_bytes_per_s=12.3e6)
    assert input_cause(s) == "storage" and not workers_wait_for_cpus(s)
    assert advice("input_bound", s) == INPUT_ADVICE["storage"]
    starved = cpu(data_wait_fraction=0.6, data_worker_busy=0.1, storage_read_bytes_per_s=12.3e6,
                  data_workers_cpu_cores=0.5, data_workers_delay_cores=0.6, data_worker_delay_fraction=0.1)
    assert input_cause(starved) == "storage" and workers_wait_for_cpus(starved)
    assert advice("input_bound", starved) == INPUT_ADVICE["storage"] + CPUS_SHORT
