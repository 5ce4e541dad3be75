# The Outrider agent image (node agent and sidecar): slim, non-root, no torch.
#   docker build -t ghcr.io/outrider-dev/outrider:0.1.0 .
# Without a registry or network (CI): scripts/build-image.sh makes the base from Debian's packages (mmdebstrap),
# a wheelhouse of the project and its dependencies on the host, and runs
#   podman build --network none --build-arg BASE=localhost/outrider-base:KEY .
# NVML comes from the node's driver through the NVIDIA container runtime (NVIDIA_DRIVER_CAPABILITIES=utility); the
# k8s extra (grpcio) lets the node agent ask the kubelet which pod owns each GPU.
ARG BASE=docker.io/library/python:3.11-slim

FROM ${BASE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY agent ./agent
# agent/outrider/alerts links here: the wheel carries the rule catalog the embedded evaluator loads by default.
COPY alerts ./alerts
# k8s: the PodResources client (grpcio); grpc: the OTLP gRPC exporter on the same grpcio (a few MB more), so that
# `otlp.protocol: grpc` (the chart's inference example) runs on this image.
# An optional wheelhouse/ in the context (the project's wheel and every dependency) lets the build run offline;
# without one pip fetches the dependencies. README.md keeps the COPY valid when there is no wheelhouse.
COPY README.md wheelhouse* /wheels/
RUN python3 -m venv /opt/outrider \
 && if ls /wheels/*.whl >/dev/null 2>&1; then \
      /opt/outrider/bin/pip install --no-cache-dir --no-index --find-links=/wheels 'outrider[k8s,grpc]'; \
    else \
      /opt/outrider/bin/pip install --no-cache-dir '/src[k8s,grpc]'; \
    fi \
 && /opt/outrider/bin/pip uninstall -y -q pip setuptools

FROM ${BASE}
COPY --from=build /opt/outrider /opt/outrider
# The dashboards' JSON, for provisioning Grafana from the image (`outrider dashboards export` needs the grafana extra).
COPY dashboards /usr/share/outrider/dashboards
# A named user for uid 65532; alert state and the notification outbox (mount a volume here to keep them across
# container replacements).
RUN echo 'outrider:x:65532:65532:outrider:/var/lib/outrider:/usr/sbin/nologin' >> /etc/passwd \
 && echo 'outrider:x:65532:' >> /etc/group \
 && mkdir -p /var/lib/outrider && chown 65532:65532 /var/lib/outrider && chmod 0700 /var/lib/outrider
# No rule-file setting: the rule catalog ships inside the package and the agent evaluates it by default.
# The listen address as an ENV, not a CMD flag, so that `-e OUTRIDER_LISTEN=...` is honoured (a flag wins over it).
ENV PATH=/opt/outrider/bin:$PATH \
    OUTRIDER_LISTEN=0.0.0.0:9477 \
    OUTRIDER_STATE_DIR=/var/lib/outrider \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
EXPOSE 9477
ENTRYPOINT ["outrider"]
CMD ["agent"]
