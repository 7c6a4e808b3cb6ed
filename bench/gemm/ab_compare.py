# Compares two dsv4-gemm-bench JSON files (new, old) shape by shape: usage python3 ab_compare.py NEW.json OLD.json
import json,sys
a,b=sys.argv[1],sys.argv[2]
n=json.load(open(a))['results']; o=json.load(open(b))['results']
def key(r):
    if 'group' in r: return ('G',r['group'],r['what'],r['t'],r['plan'])
    return ('S',r['shape'],r['what'],r['t'])
od={key(r):r for r in o}
cur=None
tot_new=tot_old=0
for r in n:
    k=key(r); ro=od.get(k)
    us=r.get('us',r.get('median_us')); uso=ro.get('us',ro.get('median_us')) if ro else float('nan')
    name=r.get('group') or (' = '.join(r['names'])+' '+r['shape'])
    if name!=cur: cur=name; print('##', name[:90])
    print(f"  {r['what']:9s} {r['plan'][:34]:34s} T={r['t']:4d} new {us:7.1f} old {uso:7.1f} x{uso/us:5.2f} floor {r['floor_us']:6.2f} rel {r['rel_err']:.1e}")
