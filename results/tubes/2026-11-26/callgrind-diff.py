#!/usr/bin/env python3
"""Instructions a message, function by function (self cost; `incl` for inclusive), of two
callgrind runs made by callgrind-server.sh or callgrind-loadgen.sh, largest differences first.

    OUT=/tmp/cg python3 callgrind-diff.py LABEL_A LABEL_B [incl]
"""
import json, os, re, subprocess, sys

OUT = os.environ.get("OUT", "/tmp/cg")
incl = len(sys.argv) > 3 and sys.argv[3] == "incl"


def load(label):
    n = json.load(open(f"{OUT}/{label}.lg.json"))["total_acks"]
    out = subprocess.run(
        ["callgrind_annotate", "--threshold=100", "--auto=no",
         "--inclusive=" + ("yes" if incl else "no"), f"{OUT}/{label}.out"],
        capture_output=True, text=True).stdout
    f = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+) \([ \d.]+%\)\s+(.*)", line)
        if m and "PROGRAM TOTALS" not in line:
            name = re.sub(r" \[.*\]$", "", m.group(2))
            name = name.split(":", 1)[1] if ":" in name else name
            f[name] = f.get(name, 0) + int(m.group(1).replace(",", "")) / n
    return f


a, b = load(sys.argv[1]), load(sys.argv[2])
if not incl:
    print(f"total: {sum(a.values()):.0f} vs {sum(b.values()):.0f}")
for k in sorted(set(a) | set(b), key=lambda k: -abs(b.get(k, 0) - a.get(k, 0)))[:45]:
    print(f"{a.get(k, 0):9.1f} {b.get(k, 0):9.1f} {b.get(k, 0) - a.get(k, 0):+8.1f}  {k[:150]}")
