#!/usr/bin/env bash
# KV tiers below HBM (docs/kv_tiers.md): Llama-3.1-70B, 2 x TP4 on a DGX
# H100, the Mooncake synthetic trace at a quarter of its rate, with
# HBM-only prefix caching, a host-DRAM tier (loads blocking, layer-wise or
# asynchronous, write-through or write-on-evict), host DRAM + NVMe
# (blocking or asynchronous), and, under
# load-balancing routing, host DRAM with and without a cluster store over
# RoCE that both replicas share. Prints one row
# per configuration: latency, SLO attainment, where prompt tokens were
# found, the traffic, and the simulator's speed. Then the store's network
# with 2, 4 and 8 replicas at the same load per replica: the blocks loaded
# from other replicas' nodes, the steps that loaded them, and the time
# those steps lost to shared links.
#   bench/kv_tiers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${SERVESIM_BIN:-build/services/servesim}
[ -x "$bin" ] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
scenario=examples/llama3.1_70b_kv_tiers_dgx_h100_mooncake.pbtxt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
quiet=(--set output.iterations_csv=false --set output.timeline=false
       --set output.report_html=false --set output.requests_csv=false)
pin=()
command -v taskset >/dev/null && pin=(taskset -c 0)

# Variants of the scenario into $tmp: other tiers (none: no kv_tiers) and
# routing. The cluster-store variant takes 50 of its 250 GB of host DRAM
# per GPU for the store; the variant it is compared with keeps all 250 GB
# in the host-DRAM tier.
variants() {
  python3 - "$scenario" "$tmp" <<'PY'
import sys
text, out = open(sys.argv[1]).read(), sys.argv[2]
start = text.index("  kv_tiers {")
end = text.index("\n  }\n", start) + 5
block = text[start:end]
first = block.index("    tier")
policy = block[block.index("    write:"):]
dram = '    tier { kind: KV_TIER_HOST_DRAM capacity_bytes_per_xpu: 200e9 link { preset: "pcie5" } }\n'
store = ('    tier { kind: KV_TIER_CLUSTER_STORE capacity_bytes_per_xpu: 50e9 '
         'link { preset: "roce-400g" } }\n')
def write(name, tiers, routing=None):
    t = text[:start] + (block[:first] + tiers + policy if tiers else "") + text[end:]
    if routing:
        t = t.replace("ROUTING_POLICY_PREFIX_AFFINITY", routing)
    open(f"{out}/{name}.pbtxt", "w").write(t)
write("none", "")
write("dram", dram)
write("lo_dram", dram.replace("200e9", "250e9"), "ROUTING_POLICY_LEAST_OUTSTANDING")
write("lo_store", dram + store, "ROUTING_POLICY_LEAST_OUTSTANDING")
PY
}

row() {  # label, then servesim run arguments
  local label=$1; shift
  "${pin[@]}" "$bin" run "$@" --quiet --out "$tmp/o" "${quiet[@]}" \
    --set workload.trace.path="$PWD/examples/traces/synthetic_trace.jsonl"
  python3 - "$tmp/o" "$label" <<'PY'
import json, sys
d, label = sys.argv[1], sys.argv[2]
s = json.load(open(f"{d}/summary.json"))
info = json.load(open(f"{d}/run_info.json"))
q = s["prefix_cache_query_tokens"]
tiers = s.get("kv_tiers", [])
lower = sum(t["hit_tokens"] for t in tiers)
hits = f"HBM {100 * (s['prefix_cache_hit_tokens'] - lower) / q:.1f}%"
for t in tiers:
    hits += f", {t['name']} {100 * t['hit_rate']:.1f}%"
loaded = sum(t["loaded_bytes"] for t in tiers) / 1e12
print(f"{label:<34} {s['ttft_s']['p50'] * 1e3:>7.0f} {s['ttft_s']['p99'] * 1e3:>7.0f} "
      f"{s['tpot_s']['p99'] * 1e3:>7.1f} {100 * s['slo_attainment']:>6.1f}% "
      f"{s['energy_per_token_j']:>6.2f} {loaded:>7.2f} {s['simulated_time_s'] / info['wall_time_s']:>6.0f}x  {hits}")
PY
}

echo "Llama-3.1-70B, 2 x TP4 on a DGX H100, Mooncake x0.25; SLO TTFT <= 5 s, TPOT <= 100 ms"
printf '%-34s %7s %7s %7s %7s %6s %7s %7s  %s\n' configuration "TTFT50" "TTFT99" "TPOT99" "SLO" \
  "J/tok" "TB in" speed "prompt tokens found in"
variants
row "HBM only" "$tmp/none.pbtxt"
row "+ host DRAM (blocking)" "$tmp/dram.pbtxt"
row "+ host DRAM (layer-wise)" "$tmp/dram.pbtxt" --set cluster.kv_tiers.load=LAYERWISE
row "+ host DRAM (async)" "$tmp/dram.pbtxt" --set cluster.kv_tiers.load=ASYNC
row "+ host DRAM (write-on-evict)" "$tmp/dram.pbtxt" --set cluster.kv_tiers.write=ON_EVICT
row "+ host DRAM + NVMe (blocking)" "$scenario"
row "+ host DRAM + NVMe (async)" "$scenario" --set cluster.kv_tiers.load=ASYNC
echo "least-outstanding routing (no cache affinity):"
row "+ host DRAM 250 GB" "$tmp/lo_dram.pbtxt"
row "+ host DRAM 200 GB + store 50 GB" "$tmp/lo_store.pbtxt"
echo "the cluster store's network, least-outstanding routing, the load per replica held:"
printf '%8s %10s %12s %7s %10s %8s %8s\n' replicas "rate" "GB from net" steps "lost ms" TTFT50 TTFT99
for n in 2 4 8; do
  rate=$(python3 -c "print(0.25 * $n / 2)")
  "${pin[@]}" "$bin" run "$tmp/lo_store.pbtxt" --quiet --out "$tmp/o" "${quiet[@]}" \
    --set workload.trace.path="$PWD/examples/traces/synthetic_trace.jsonl" \
    --set cluster.replicas="$n" --set workload.rate_scale="$rate"
  python3 - "$tmp/o" "$n" "$rate" <<'PY'
import json, sys
d, n, rate = sys.argv[1], sys.argv[2], sys.argv[3]
s = json.load(open(f"{d}/summary.json"))
st = [t for t in s["kv_tiers"] if t["name"] == "cluster_store"][0]
print(f"{n:>8} {rate:>10} {st['network_bytes'] / 1e9:>12.0f} {st['network_steps']:>7} "
      f"{st['contention_s'] * 1e3:>10.0f} {s['ttft_s']['p50'] * 1e3:>8.0f} {s['ttft_s']['p99'] * 1e3:>8.0f}")
PY
done
