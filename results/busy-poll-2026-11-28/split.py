#!/usr/bin/env python3
"""Where a message's server CPU goes, user space or kernel: tarq and its null server at depths
1 and 16 (4+4 connections, 32-byte payloads), the server pinned to core 0 and the loadgen to
core 1, /proc/<pid>/stat's utime and stime over 3 s from 1.5 s into each run, per message.

  split.py BIN_DIR OUT_JSON
"""
import subprocess, socket, time, sys, os, tempfile, json
BIN, OUT = sys.argv[1], sys.argv[2]
TICK=os.sysconf("SC_CLK_TCK")
def port():
    s=socket.socket(); s.bind(("127.0.0.1",0)); p=s.getsockname()[1]; s.close(); return p
out={}
head={"commit": subprocess.run(["git","rev-parse","--short=10","HEAD"],capture_output=True,text=True).stdout.strip(),
      "binary": os.path.realpath(f"{BIN}/tarq"), "machine": os.uname().nodename, "cores": os.cpu_count(),
      "loadavg_before": open("/proc/loadavg").read().strip()}
for kind, depth in [("tarq",1),("null",1),("tarq",16),("null",16)]:
    p=port(); d=tempfile.mkdtemp()
    cmd=["taskset","-c","0",f"{BIN}/tarq","--listen",f"127.0.0.1:{p}","--data-dir",d+"/data","--cpu","0","--log-level","warn"]+(["--null"] if kind=="null" else [])
    srv=subprocess.Popen(cmd,stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL)
    for _ in range(200):
        try: socket.create_connection(("127.0.0.1",p),timeout=1).close(); break
        except OSError: time.sleep(0.02)
    lg=subprocess.Popen([f"{BIN}/tarq-loadgen","--target",kind,"--addr",f"127.0.0.1:{p}","--producers","4","--consumers","4","--depth",str(depth),"--payload","32","--duration","4s","--warmup","1s","--cpu","1","--quiet","--json",f"{OUT}.{kind}-{depth}.lg.json"],stdout=subprocess.DEVNULL)
    time.sleep(1.5)
    def st():
        f=open(f"/proc/{srv.pid}/stat").read().rsplit(")",1)[1].split(); return int(f[11]),int(f[12])
    u0,s0=st(); time.sleep(3); u1,s1=st()
    lg.wait(); srv.terminate(); srv.wait()
    rate=json.load(open(f"{OUT}.{kind}-{depth}.lg.json"))["msgs_per_s"]
    os.remove(f"{OUT}.{kind}-{depth}.lg.json")
    msgs=rate*3
    out[f"{kind}-d{depth}"]={"msgs_per_s":round(rate),"user_us_per_msg":round((u1-u0)/TICK*1e6/msgs,2),"system_us_per_msg":round((s1-s0)/TICK*1e6/msgs,2)}
    print(kind,depth,out[f"{kind}-d{depth}"],flush=True)
head["loadavg_after"]=open("/proc/loadavg").read().strip()
head["runs"]=out
json.dump(head,open(OUT,"w"),indent=1)
