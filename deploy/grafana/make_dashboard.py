#!/usr/bin/env python3
"""Writes deploy/grafana/dsv4-dashboard.json, the Grafana dashboard for dsv4-serve.

The dashboard is generated so that its panels stay uniform; edit this file, run it, commit both.
  python3 deploy/grafana/make_dashboard.py
tests/deploy checks that the committed JSON equals this script's output and runs every query against a live
Prometheus (prometheus_e2e_test.py).
"""
import json
import os

W = 'role="worker",group=~"$group",rank=~"$rank"'
LEAD = 'role="worker",group=~"$group",rank="0"'  # leaders own batch, queue and token counts
C = 'role="coordinator"'


def quantiles(metric, sel, by, window="5m"):
    return [(f'histogram_quantile({q}, sum by (le{by}) (rate({metric}_bucket{{{sel}}}[{window}])))',
             f'p{int(q * 100)}' + (" {{group}}" if by else "")) for q in (0.5, 0.9, 0.99)]


# (title, unit, [(expr, legend)], kind)
PANELS = [
    ("Generation throughput (tokens/s)", "short",
     [(f'sum by (group) (rate(dsv4_generation_tokens_total{{{LEAD}}}[1m]))', "group {{group}}"),
      (f'sum(rate(dsv4_generation_tokens_total{{{C}}}[1m]))', "all (coordinator)")], "timeseries"),
    ("Prompt throughput (tokens/s)", "short",
     [(f'sum by (group) (rate(dsv4_prompt_tokens_total{{{LEAD}}}[1m]))', "group {{group}}")], "timeseries"),
    ("Time to first token (coordinator)", "s", quantiles("dsv4_time_to_first_token_seconds", C, ""), "timeseries"),
    ("Inter-token latency by group", "s",
     quantiles("dsv4_inter_token_latency_seconds", LEAD, ", group"), "timeseries"),
    ("End-to-end request latency (coordinator)", "s",
     quantiles("dsv4_e2e_request_latency_seconds", C, ""), "timeseries"),
    ("KV cache usage", "percentunit",
     [(f'dsv4_kv_cache_usage_ratio{{{W}}}', "group {{group}} rank {{rank}}")], "timeseries"),
    ("Decode batch size (mean per step)", "short",
     [(f'sum by (group) (rate(dsv4_decode_batch_size_sum{{{LEAD}}}[1m])) / '
       f'sum by (group) (rate(dsv4_decode_batch_size_count{{{LEAD}}}[1m]))', "group {{group}}")], "timeseries"),
    ("Queue: running and waiting requests", "short",
     [(f'sum by (group) (dsv4_num_requests_running{{{LEAD}}})', "running {{group}}"),
      (f'sum by (group) (dsv4_num_requests_waiting{{{LEAD}}})', "waiting {{group}}"),
      (f'sum(dsv4_num_requests_waiting{{{C}}})', "waiting (coordinator)")], "timeseries"),
    ("Engine heartbeat: seconds without a finished step while busy", "s",
     [(f'dsv4_engine_seconds_since_progress{{{W}}}', "group {{group}} rank {{rank}}")], "timeseries"),
    ("Attention share of decode time", "percentunit",
     [(f'dsv4_attention_time_share{{{W}}}', "group {{group}} rank {{rank}}")], "gauge"),
    ("Decode time share by phase", "percentunit",
     [(f'sum by (group, rank, phase) (rate(dsv4_decode_gpu_seconds_total{{{W}}}[5m])) / on (group, rank) '
       f'group_left sum by (group, rank) (rate(dsv4_decode_gpu_seconds_total{{{W}}}[5m]))',
       "{{phase}} g{{group}} r{{rank}}")], "timeseries"),
    ("Finished requests by reason (per s)", "short",
     [(f'sum by (reason) (rate(dsv4_request_finished_total{{{C}}}[5m]))', "{{reason}}")], "timeseries"),
    ("Targets up", "short",
     [('up{job=~"dsv4-coordinator|dsv4-worker"}', "{{job}} {{instance}}")], "stat"),
    ("Ready groups and the checkpoints they serve (coordinator)", "short",
     [(f'dsv4_coordinator_ready_groups{{{C}}}', "ready groups {{instance}}"),
      (f'dsv4_coordinator_ready_checkpoints{{{C}}}', "checkpoints {{instance}}")], "stat"),
    ("Start-up: weight load and graph capture", "s",
     [(f'dsv4_startup_weight_load_seconds{{{W}}}', "load g{{group}} r{{rank}}"),
      (f'dsv4_startup_graph_capture_seconds{{{W}}}', "capture g{{group}} r{{rank}}"),
      (f'dsv4_startup_total_seconds{{{W}}}', "total g{{group}} r{{rank}}")], "stat"),
    ("Start-up: weight load throughput", "Bps",
     [(f'dsv4_startup_weight_load_bytes_per_second{{{W}}}', "g{{group}} r{{rank}}")], "stat"),
]


def panel(i, title, unit, targets, kind):
    return {
        "id": i + 1,
        "type": kind,
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [{"refId": chr(ord("A") + k), "expr": e, "legendFormat": leg,
                     "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                    for k, (e, leg) in enumerate(targets)],
    }


def variable(name, query):
    return {"name": name, "label": name, "type": "query", "includeAll": True, "multi": True,
            "allValue": ".*", "current": {"text": "All", "value": "$__all"},
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "query": {"query": query, "refId": name}, "definition": query, "refresh": 2, "sort": 3}


def dashboard():
    return {
        "title": "dsv4-serve",
        "uid": "dsv4-serve",
        "tags": ["dsv4", "llm-serving"],
        "schemaVersion": 38,
        "version": 1,
        "editable": True,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "10s",
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0},
            variable("group", 'label_values(dsv4_num_requests_running{role="worker"}, group)'),
            variable("rank", 'label_values(dsv4_num_requests_running{role="worker",group=~"$group"}, rank)'),
        ]},
        "panels": [panel(i, *p) for i, p in enumerate(PANELS)],
    }


def render():
    return json.dumps(dashboard(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dsv4-dashboard.json")
    with open(out, "w") as f:
        f.write(render())
    print(f"wrote {out}")
