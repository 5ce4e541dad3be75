"""The training job's identity with zero configuration: each platform's source on its own (the environment a
launcher or an operator sets, the pod's /etc/hosts line), the order between them, and what is never taken for one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from outrider.hook import settings
from outrider.hook.settings import derive_training_job, read

K8S = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}


@pytest.fixture(autouse=True)
def no_pod_labels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine's own /etc/podinfo/labels (a CI pod's) never leaks into a case."""
    monkeypatch.setattr(settings, "POD_LABELS_PATH", str(tmp_path / "no-podinfo-labels"))


def hosts(tmp_path: Path, *lines: str) -> str:
    path = tmp_path / "hosts"
    path.write_text("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n" + "".join(f"{x}\n" for x in lines))
    return str(path)


@pytest.mark.parametrize(("env", "job", "source"), [
    ({"OUTRIDER_TRAINING_JOB": "llama-sft"}, "llama-sft", "outrider"),
    ({"TORCHELASTIC_RUN_ID": "rdzv-42"}, "rdzv-42", "torchrun"),
    ({"JOBSET_NAME": "pretrain"}, "pretrain", "jobset"),
    ({"RAY_JOB_SUBMISSION_ID": "raysubmit_4LamXRuQpYdSMg7J"}, "raysubmit_4LamXRuQpYdSMg7J", "ray"),
    ({"RAY_CLUSTER_NAME": "rayjob-sample-raycluster-x7k2p"}, "rayjob-sample-raycluster-x7k2p", "ray"),
    ({"VC_WORKER_HOSTS": "mnist-worker-0.mnist,mnist-worker-1.mnist", "VC_TASK_INDEX": "1"}, "mnist", "volcano"),
    ({**K8S, "MASTER_ADDR": "pytorch-dist-mnist-master-0", "MASTER_PORT": "23456"}, "pytorch-dist-mnist",
     "kubeflow"),
    ({"PET_MASTER_ADDR": "my-trainjob-node-0-0.my-trainjob", "PET_NNODES": "2"}, "my-trainjob", "kubeflow"),
    ({**K8S, "HOSTNAME": "train-5-abcde", "JOB_COMPLETION_INDEX": "5"}, "train", "indexed_job"),
    ({**K8S, "HOSTNAME": "train-12", "JOB_COMPLETION_INDEX": "12"}, "train", "indexed_job"),
])
def test_each_platform_names_the_job(tmp_path: Path, env: dict[str, str], job: str, source: str) -> None:
    assert derive_training_job(env, hosts(tmp_path)) == (job, source)


def test_the_pods_subdomain_from_the_kubelets_hosts_line(tmp_path: Path) -> None:
    """A JobSet's pods: hostname <jobset>-<replicated job>-<job index>-<pod index>, subdomain the JobSet's name."""
    path = hosts(tmp_path, "10.244.1.7\tpretrain-workers-0-3.pretrain.ml.svc.cluster.local\tpretrain-workers-0-3")
    env = {**K8S, "HOSTNAME": "pretrain-workers-0-3"}
    assert derive_training_job(env, path) == ("pretrain", "subdomain")
    assert derive_training_job({"HOSTNAME": "pretrain-workers-0-3"}, path) == ("", ""), "not in Kubernetes"
    other = hosts(tmp_path, "127.0.1.1\tbuild-box.corp.example.com\tbuild-box")  # a plain machine's hosts file
    assert derive_training_job({**K8S, "HOSTNAME": "build-box"}, other) == ("", "")


def test_the_pods_labels_through_the_downward_api_framework_first(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    labels = tmp_path / "labels"
    monkeypatch.setattr(settings, "POD_LABELS_PATH", str(labels))
    labels.write_text('app="trainer"\nbatch.kubernetes.io/job-name="pretrain-workers-0"\n'
                      'jobset.sigs.k8s.io/jobset-name="pretrain"\npod-template-hash="7d9f"\n')
    env: dict[str, str] = {}
    assert derive_training_job(env, hosts(tmp_path)) == ("pretrain", "pod_labels"), "the JobSet, not its Job"
    labels.write_text('batch.kubernetes.io/job-name="finetune"\njob-name="finetune"\n')
    assert derive_training_job(env, hosts(tmp_path)) == ("finetune", "pod_labels")
    labels.write_text('app="web"\n')
    assert derive_training_job(env, hosts(tmp_path)) == ("", "")
    labels.unlink()
    assert derive_training_job(env, hosts(tmp_path)) == ("", "")


def test_the_first_source_wins_in_the_documented_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = hosts(tmp_path, "10.0.0.9\tjs-w-0-0.js.ml.svc.cluster.local\tjs-w-0-0")
    pod_labels = tmp_path / "labels"
    pod_labels.write_text('volcano.sh/job-name="labelled"\n')
    monkeypatch.setattr(settings, "POD_LABELS_PATH", str(pod_labels))
    everything = {**K8S, "OUTRIDER_TRAINING_JOB": "mine", "TORCHELASTIC_RUN_ID": "rdzv", "JOBSET_NAME": "js",
                  "RAY_JOB_SUBMISSION_ID": "ray", "VC_W_HOSTS": "vc-w-0.vc", "MASTER_ADDR": "kf-master-0",
                  "HOSTNAME": "js-w-0-0", "JOB_COMPLETION_INDEX": "0"}
    order = ["outrider", "torchrun", "jobset", "pod_labels", "ray", "volcano", "kubeflow", "subdomain", "indexed_job"]
    expected = {"outrider": "mine", "torchrun": "rdzv", "jobset": "js", "pod_labels": "labelled", "ray": "ray",
                "volcano": "vc",
                "kubeflow": "kf", "subdomain": "js", "indexed_job": "js-w-0"}
    removes = {"outrider": ["OUTRIDER_TRAINING_JOB"], "torchrun": ["TORCHELASTIC_RUN_ID"], "jobset": ["JOBSET_NAME"],
               "pod_labels": [],
               "ray": ["RAY_JOB_SUBMISSION_ID"], "volcano": ["VC_W_HOSTS"], "kubeflow": ["MASTER_ADDR"],
               "subdomain": ["HOSTNAME"]}
    env = dict(everything)
    for source in order:
        if source == "indexed_job":  # the hosts line is gone with HOSTNAME: give the indexed job its own name
            env["HOSTNAME"] = "js-w-0-0"
            path = hosts(tmp_path)
        assert derive_training_job(env, path) == (expected[source], source)
        for key in removes.get(source, []):
            env.pop(key)
        if source == "pod_labels":
            pod_labels.unlink()


@pytest.mark.parametrize("env", [
    {},
    {"TORCHELASTIC_RUN_ID": "none"},  # torchrun's placeholder without a rendezvous id
    {"MASTER_ADDR": "pytorch-master-0"},  # outside Kubernetes: a host name like any other
    {**K8S, "MASTER_ADDR": "10.0.0.1"},
    {**K8S, "HOSTNAME": "web-7d9f-abcde", "JOB_COMPLETION_INDEX": "3"},  # the index is not in the name
    {**K8S, "HOSTNAME": "train-5-abcde"},  # not an Indexed Job
    {"VC_WORKER_HOSTS": "justahost"},
    {"PET_MASTER_ADDR": "10.1.2.3"},
])
def test_nothing_is_taken_for_a_job_that_does_not_say_one(tmp_path: Path, env: dict[str, str]) -> None:
    assert derive_training_job(env, hosts(tmp_path)) == ("", "")


def test_settings_take_the_derived_job_bounded_and_an_unreadable_hosts_file_costs_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config, problems = read({"JOBSET_NAME": "j" * 500})
    assert config.training_job == "j" * settings.MAX_TEXT and problems == []
    assert read({"OUTRIDER_TRAINING_JOB": "mine", "JOBSET_NAME": "js"})[0].training_job == "mine"
    assert derive_training_job({**K8S, "HOSTNAME": "h"}, str(tmp_path / "missing")) == ("", "")


def test_a_hooked_process_publishes_the_derived_job(tmp_path: Path) -> None:
    """The shard's meta carries it, so the agent labels every series of the rank with it."""
    code = ("import outrider, outrider.hook.api as api; outrider.instrument(); "
            "print(api.S.hook.identity.meta()['training_job'])")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path), "OUTRIDER_SPOOL_DIR": str(tmp_path),
           "OUTRIDER_STANDALONE": "false", "VC_WORKER_HOSTS": "bert-worker-0.bert,bert-worker-1.bert"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "bert", out.stderr
