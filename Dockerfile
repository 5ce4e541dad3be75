# The Outrider agent image (node agent and sidecar): slim, non-root, no shell, no torch.
#   docker build -t ghcr.io/outrider-dev/outrider:0.1.0 .
# builds it on python:3.11-slim (a larger image, with a shell). scripts/build-image.sh builds it without a registry
# or network, reproducibly, on Debian's packages: a base made with mmdebstrap for the build stage, and as the final
# stage's root only the files of the packages the agent runs on (scripts/image/runtime-root.py):
#   podman build --network none --timestamp EPOCH --omit-history \
#     --build-arg BASE=localhost/outrider-base:KEY --build-arg RUNTIME=localhost/outrider-runtime:KEY .
# NVML comes from the node's driver through the NVIDIA container runtime (NVIDIA_DRIVER_CAPABILITIES=utility); the
# k8s extra (gRPC on h2, protobuf) lets the node agent ask the kubelet which pod owns each GPU.
ARG BASE=docker.io/library/python:3.11-slim
# The final stage's root: BASE itself unless a slimmer root with the same Python is given. Nothing runs in it.
ARG RUNTIME=${BASE}

FROM ${BASE} AS build
# For the build's reproducibility: under it pip compiles hash-checked byte code (py_compile's default), not byte
# code stamped with the install's time (Python 3.11's marshal writes sets in one order whatever the hash seed).
ARG SOURCE_DATE_EPOCH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY agent ./agent
# agent/outrider/alerts links here: the wheel carries the rule catalog the embedded evaluator loads by default.
COPY alerts ./alerts
# k8s: the PodResources client; grpc: the OTLP gRPC exporter (both gRPC on h2, outrider/adapters/grpc_client.py: no
# grpcio), so that `otlp.protocol: grpc` (the chart's inference example) runs on this image.
# An optional wheelhouse/ in the context (the project's wheel and every dependency, scripts/image/requirements.txt)
# lets the build run offline; without one pip fetches the dependencies. README.md keeps the COPY valid when there is
# no wheelhouse.
COPY README.md wheelhouse* /wheels/
# The environment, then a named user for uid 65532 and its state directory (copied into the final stage, which
# runs nothing).
RUN python3 -m venv /opt/outrider \
 && if ls /wheels/*.whl >/dev/null 2>&1; then \
      /opt/outrider/bin/pip install --no-cache-dir --no-index --find-links=/wheels 'outrider[k8s,grpc]'; \
    else \
      /opt/outrider/bin/pip install --no-cache-dir '/src[k8s,grpc]'; \
    fi \
 && /opt/outrider/bin/pip uninstall -y -q pip setuptools \
 && mkdir -p /out/etc /out/lib/outrider \
 && cp /etc/passwd /etc/group /out/etc/ \
 && echo 'outrider:x:65532:65532:outrider:/var/lib/outrider:/usr/sbin/nologin' >> /out/etc/passwd \
 && echo 'outrider:x:65532:' >> /out/etc/group \
 && chmod 0700 /out/lib/outrider

FROM ${RUNTIME}
COPY --from=build /opt/outrider /opt/outrider
COPY --from=build /out/etc/passwd /out/etc/group /etc/
# Alert state and the notification outbox (mount a volume here to keep them across container replacements); lib/'s
# contents, so that the directory keeps its mode.
COPY --from=build --chown=65532:65532 /out/lib/ /var/lib/
# The dashboards' JSON, for provisioning Grafana from the image (`outrider dashboards export` needs the grafana extra).
COPY dashboards /usr/share/outrider/dashboards
# No rule-file setting: the rule catalog ships inside the package and the agent evaluates it by default.
# The listen address as an ENV, not a CMD flag, so that `-e OUTRIDER_LISTEN=...` is honoured (a flag wins over it).
# PATH in full: the runtime root sets none.
ENV PATH=/opt/outrider/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    OUTRIDER_LISTEN=0.0.0.0:9477 \
    OUTRIDER_STATE_DIR=/var/lib/outrider \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
EXPOSE 9477
ENTRYPOINT ["outrider"]
CMD ["agent"]
