"""Readers of what the Linux kernel publishes: /proc (procfs), the memory cgroups (cgroupfs) and the kernel log
(/dev/kmsg, kmsg). Standard library only and importing nothing else of outrider, so the hook in the workload and
every part of the agent read these files through the one parser each: one function per file, the root a parameter
(tests point it at fixture trees), plain values back; what to make of them is the caller's business."""
