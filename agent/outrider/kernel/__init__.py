"""Readers of what the Linux kernel publishes: /proc (procfs), the memory and CPU cgroups (cgroupfs), the kernel log
(/dev/kmsg, kmsg) and the clock's synchronisation (adjtimex, timex). Standard library only and importing nothing else
of outrider, so the hook in the workload and every part of the agent read these files through the one parser each:
one function per file, the root a parameter (tests point it at fixture trees), plain values back; what to make of
them is the caller's business."""
