"""Kubernetes sources the agent asks about its node: which workload owns each GPU (gpu_owners, through the kubelet's
PodResources API, whose generated gRPC client lives in podresources/). Nothing here imports grpc until it is asked."""
