"""Turns deploy/prometheus/prometheus-k8s.yml into a config Debian's Prometheus accepts (it is built without
Kubernetes discovery): each kubernetes_sd_configs block becomes static_configs whose targets carry the __meta
labels pod discovery would set, so the file's relabel rules run unchanged. Shared by check_deploy.py and
prometheus_e2e_test.py."""
import copy


def pod_target(address, name, metrics_port, scrape="true", namespace="dsv4", pod="pod"):
    """A static target that looks like a discovered pod (container port `address`, annotated metrics port)."""
    return {"targets": [address], "labels": {
        "__meta_kubernetes_pod_annotation_prometheus_io_scrape": scrape,
        "__meta_kubernetes_pod_annotation_prometheus_io_port": str(metrics_port),
        "__meta_kubernetes_pod_label_app_kubernetes_io_name": name,
        "__meta_kubernetes_namespace": namespace,
        "__meta_kubernetes_pod_name": pod,
        "__meta_kubernetes_pod_node_name": "node0",
    }}


def to_static(config, targets, scrape_interval=None):
    """Returns a copy of `config` with every kubernetes_sd_configs replaced by `targets` (pod_target entries)."""
    out = copy.deepcopy(config)
    if scrape_interval:
        out.setdefault("global", {})["scrape_interval"] = scrape_interval
        out["global"]["evaluation_interval"] = scrape_interval
    replaced = 0
    for job in out.get("scrape_configs", []):
        if "kubernetes_sd_configs" in job:
            del job["kubernetes_sd_configs"]
            job["static_configs"] = targets
            replaced += 1
    if replaced == 0:
        raise ValueError("prometheus-k8s.yml has no kubernetes_sd_configs block")
    return out
