"""Reads the runs in this directory and writes summary.json: the median msgs/s of each
configuration over its rounds, the replication delay probes, and the failover test's figures."""
import glob, json, os, statistics
here = os.path.dirname(os.path.abspath(__file__))
configs = ["single", "r1_async", "r2_async", "r1_sync1", "r2_sync1", "r2_sync2"]
out = {"throughput_msgs_per_s": {}, "replication_delay_ms": {}}
for c in configs:
    runs = sorted(glob.glob(os.path.join(here, c + "_[0-9].json")))
    rates = [json.load(open(r))["msgs_per_s"] for r in runs]
    out["throughput_msgs_per_s"][c] = {"median": statistics.median(rates), "runs": rates}
for name in ["lag33_async", "lag33_sync1", "lag50_async", "lag50_sync1"]:
    probe = json.load(open(os.path.join(here, name + ".lag.json")))
    load = json.load(open(os.path.join(here, name + ".json")))
    probe["rate_msgs_per_s"] = load["config"]["rate"]
    probe["acks_per_s"] = load["acks_per_s"]
    out["replication_delay_ms"][name] = probe
failover = os.path.join(here, "failover.json")
if os.path.exists(failover):
    out["failover"] = json.load(open(failover))
json.dump(out, open(os.path.join(here, "summary.json"), "w"), indent=2)
t = out["throughput_msgs_per_s"]
for c in configs:
    print(f"{c:10} {t[c]['median']:>10,.0f}  {t[c]['median'] / t['single']['median']:.2f}x single")
for n, p in out["replication_delay_ms"].items():
    print(f"{n:12} rate {p['rate_msgs_per_s']:>7} acks/s {p['acks_per_s']:>9,.0f}  p50 {p['p50_ms']:.2f} p99 {p['p99_ms']:.2f} max {p['max_ms']:.2f} ms")
