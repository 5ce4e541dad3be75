# The Outrider agent image (node agent and sidecar): slim, non-root, no torch.
#   docker build -t ghcr.io/outrider-dev/outrider:0.1.0 .
# NVML comes from the node's driver through the NVIDIA container runtime (NVIDIA_DRIVER_CAPABILITIES=utility).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY agent ./agent
# agent/outrider/alerts links here: the wheel carries the rule catalog the embedded evaluator loads by default.
COPY alerts ./alerts
RUN pip install --no-cache-dir --prefix=/install .

FROM python:3.11-slim
COPY --from=build /install /usr/local
# The rule file and dashboards, for `outrider rules export` and the embedded evaluator.
COPY alerts /usr/share/outrider/alerts
COPY dashboards /usr/share/outrider/dashboards
# Alert state and the notification outbox (mount a volume here to keep them across container replacements).
RUN mkdir -p /var/lib/outrider && chown 65532:65532 /var/lib/outrider && chmod 0700 /var/lib/outrider
ENV OUTRIDER_RULES_FILE=/usr/share/outrider/alerts/outrider.rules.yaml \
    OUTRIDER_STATE_DIR=/var/lib/outrider \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
EXPOSE 9477
ENTRYPOINT ["outrider"]
CMD ["agent", "--listen", "0.0.0.0:9477"]
