"""Kubernetes sources the agent asks about its node and pod: which workload owns each GPU (gpu_owners, through the
kubelet's PodResources API, whose generated gRPC client lives in podresources/), the node's running pods (node_pods,
through the API server, for a node agent that scrapes their own endpoints), and the pod's own annotations
(downward, from a Downward API volume). Nothing here imports grpc until it is asked."""
