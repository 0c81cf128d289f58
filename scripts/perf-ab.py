# Ratio table of two forms measured in one run: python3 scripts/perf-ab.py PREFIX DIR A B reads
# DIR/PREFIX-A-*.json and DIR/PREFIX-B-*.json (mscclpp-perf --json) and prints the mean time
# per size (out of place and in place together) and B/A.
import json,sys,math,glob
pre,d,a,b=sys.argv[1:5]
def rows(k):
    out={}
    for f in sorted(glob.glob(f"{d}/{pre}-{k}-*.json")):
        for r in json.load(open(f))['rows']:
            m=r['mscclpp']; out.setdefault(r['bytes'],[]).extend([m['out_of_place']['time_us'],m['in_place']['time_us']])
    return out
A,B=rows(a),rows(b)
print(f"{'bytes':>10} {a+' us':>14} {b+' us':>14} {b+'/'+a:>12}")
g=[]
for s in sorted(A):
    if s not in B: continue
    x=sum(A[s])/len(A[s]); y=sum(B[s])/len(B[s]); g.append(y/x)
    print(f"{s:>10} {x:>14.1f} {y:>14.1f} {y/x:>12.2f}")
print("geomean", round(math.exp(sum(map(math.log,g))/len(g)),3))
