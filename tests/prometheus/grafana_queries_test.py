#!/usr/bin/env python3
"""Every metric (and label) the Grafana dashboard queries exists on a live
servesim's /metrics.

grafana_queries_test.py --servesim BIN --scenario FILE --dashboard JSON [--set path=value ...]

Extracts the PromQL of every panel target and template variable, takes the
servesim_* metric names, the label names in selectors, by/without clauses
and legend templates, runs a short servesim with --metrics and checks each
against the scrape once the run is done. Python 3 stdlib only.
"""
import argparse
import json
import re
import sys
import os

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import servesim_live as live  # noqa: E402

# PromQL functions, aggregations and keywords the dashboard may use.
PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values", "group",
    "rate", "irate", "increase", "delta", "idelta", "deriv", "predict_linear", "resets", "changes",
    "histogram_quantile", "scalar", "vector", "clamp_min", "clamp_max", "clamp", "abs", "ceil", "floor", "round",
    "label_replace", "label_join", "label_values", "avg_over_time", "max_over_time", "min_over_time",
    "sum_over_time", "last_over_time", "absent", "time", "timestamp",
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset",
}
# Labels Prometheus adds to every scraped series, and the bucket bound.
SCRAPE_LABELS = {"instance", "job"}


def queries(dash):
    """(where, expr, legendFormat) for every PromQL query in the dashboard."""
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                if "expr" not in t or not t["expr"].strip():
                    live.fail(f"panel {p.get('title')!r} target {t.get('refId')} has no expr")
                out.append((f"panel {p.get('title')!r} {t.get('refId')}", t["expr"], t.get("legendFormat", "")))
            walk(p.get("panels", []))
    walk(dash.get("panels", []))
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v.get("query")
            expr = q.get("query") if isinstance(q, dict) else q
            # Grafana's label_values(METRIC, LABEL) -> the PromQL it stands for
            m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", expr)
            if m:
                expr = f"group by ({m.group(2)}) ({m.group(1)})"
            out.append((f"variable ${v['name']}", expr, ""))
    return out


def analyse(expr):
    """-> (metric names, {metric: label names in its selector}, label names in by/without/on clauses)."""
    body = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)           # string literals
    body = re.sub(r"\[[^\]]*\]", "", body)                     # range selectors
    body = re.sub(r"\$\{?\w+\}?", "", body)                    # Grafana variables left outside strings
    metrics, selectors, clause_labels = set(), {}, set()
    for m in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}", body):
        selectors.setdefault(m.group(1), set()).update(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", m.group(2)))
    for m in re.finditer(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", body):
        clause_labels.update(x.strip() for x in m.group(1).split(",") if x.strip())
    bare = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", body)
    bare = re.sub(r"\{[^}]*\}", " ", bare)
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)", bare):
        word = m.group(1)
        if word in PROMQL_WORDS or re.fullmatch(r"e\d*|inf|nan|Inf|NaN", word):
            continue
        if not word.startswith("servesim_"):
            raise ValueError(f"'{word}' is neither a known PromQL function nor a servesim_ metric")
        metrics.add(word)
    return metrics, selectors, clause_labels


def check(dash, parsed):
    """Returns a list of problems (empty when the dashboard matches the scrape)."""
    labels_of = {}
    for name, labels, _ in parsed["samples"]:
        labels_of.setdefault(name, set()).update(labels)
    histograms = {f for f, t in parsed["types"].items() if t in ("histogram", "summary")}

    def exists(name):
        if name in labels_of:
            return True
        return name in histograms  # a histogram's family name stands for _bucket/_sum/_count

    def labels(name):
        if name in histograms:
            return set().union(*(labels_of.get(name + s, set()) for s in ("_bucket", "_sum", "_count")))
        return labels_of.get(name, set())

    problems = []
    qs = queries(dash)
    if len(qs) < 10:
        problems.append(f"only {len(qs)} queries found in the dashboard: is the JSON complete?")
    for where, expr, legend in qs:
        try:
            metrics, selectors, clause_labels = analyse(expr)
        except ValueError as e:
            problems.append(f"{where}: {e} in {expr!r}")
            continue
        if not metrics:
            problems.append(f"{where}: no servesim_ metric in {expr!r}")
        for name in sorted(metrics):
            if not exists(name):
                problems.append(f"{where}: {name} is not on /metrics ({expr!r})")
        for name, used in selectors.items():
            for lab in sorted(used - SCRAPE_LABELS - labels(name)):
                problems.append(f"{where}: {name} has no label '{lab}' on /metrics")
        known = set().union(*(labels(n) for n in metrics)) | SCRAPE_LABELS if metrics else SCRAPE_LABELS
        for lab in sorted(clause_labels - known):
            problems.append(f"{where}: label '{lab}' (by/on clause) is on none of {sorted(metrics)}")
        for lab in sorted(set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend)) - known):
            problems.append(f"{where}: legend uses '{{{{{lab}}}}}', a label none of {sorted(metrics)} has")
    return problems


def self_test():
    """The checker itself catches a wrong metric, a wrong label and a foreign metric."""
    scrape = live.parse("# TYPE servesim_a_seconds histogram\n"
                        'servesim_a_seconds_bucket{replica="0",le="+Inf"} 1\nservesim_a_seconds_count{replica="0"} 1\n'
                        'servesim_a_seconds_sum{replica="0"} 1\nservesim_b_total{replica="0",kind="gpu"} 3\n')
    fake = lambda *exprs: {"panels": [{"title": "t", "targets": [{"refId": "A", "expr": e, "legendFormat": "{{replica}}"} for e in exprs]}] * 10}
    good = fake('histogram_quantile(0.9, sum by (le, replica) (rate(servesim_a_seconds_bucket{instance="$instance"}[$__rate_interval])))',
                'sum by (replica) (rate(servesim_b_total{kind="gpu"}[1m])) / scalar(deriv(servesim_a_seconds_sum[1m]))',
                'servesim_a_seconds')
    assert check(good, scrape) == [], check(good, scrape)
    for bad, why in [('rate(servesim_nope_total[1m])', "not on /metrics"),
                     ('sum by (device) (servesim_b_total)', "label 'device'"),
                     ('servesim_b_total{device="xpu"}', "no label 'device'"),
                     ('rate(node_cpu_seconds_total[1m])', "neither a known PromQL function")]:
        found = check(fake(bad), scrape)
        assert any(why in p for p in found), (bad, found)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servesim", required=True)
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--dashboard", required=True)
    ap.add_argument("--set", action="append", default=[], dest="sets")
    a = ap.parse_args()

    self_test()
    with open(a.dashboard) as f:
        dash = json.load(f)
    ids = [p["id"] for p in dash.get("panels", [])]
    if len(ids) != len(set(ids)):
        live.fail(f"duplicate panel ids in {a.dashboard}")

    run = live.Servesim(a.servesim, a.scenario, linger=30, sets=a.sets)
    try:
        text = run.wait_done(timeout=120)
    finally:
        run.stop()
    parsed = live.parse(text)
    problems = check(dash, parsed)
    names = sorted({m for _, e, _ in queries(dash) for m in analyse(e)[0]})
    print(f"{len(queries(dash))} queries over {len(names)} metrics: {', '.join(names)}")
    if problems:
        live.fail("the Grafana dashboard queries what /metrics does not have:\n- " + "\n- ".join(problems))
    print("PASS")


if __name__ == "__main__":
    main()
