"""How much long reads delay everything else on a flightlog server.

Four clients loop on long reads (10,000 runs listed, the open roots, 10,000 changes, 10,000
terminal roots) for SECONDS while a fifth times `/healthz` and one span read, 10 ms apart.
Run it against a server on a big database (see big_activity_db.py):

    python3 bench/long_read_stall.py PORT [SECONDS]
"""
import sys, time, threading, urllib.request
port=sys.argv[1]; secs=float(sys.argv[2]) if len(sys.argv)>2 else 8
stop=time.time()+secs
heavy=["/v1/activity/runs?limit=10000","/v1/activity/open-roots","/v1/activity/changes?after=0&limit=10000","/v1/activity/changes/terminal-roots?after=0&limit=10000"]
counts=[0]*4
def loop(i):
    while time.time()<stop:
        urllib.request.urlopen(f"http://127.0.0.1:{port}{heavy[i%4]}").read(); counts[i%4]+=1
ts=[threading.Thread(target=loop,args=(i,)) for i in range(4)]
[t.start() for t in ts]
lat={"healthz":[],"span":[]}
while time.time()<stop:
    for k,p in (("healthz","/healthz"),("span","/v1/activity/spans/r77t2")):
        a=time.perf_counter(); urllib.request.urlopen(f"http://127.0.0.1:{port}{p}").read(); lat[k].append((time.perf_counter()-a)*1000)
    time.sleep(0.01)
[t.join() for t in ts]
for k,v in lat.items():
    v.sort(); print(k, "n",len(v),"p50 %.2f p99 %.2f max %.2f ms"%(v[len(v)//2], v[int(len(v)*0.99)], v[-1]))
print("heavy reads done", counts)
