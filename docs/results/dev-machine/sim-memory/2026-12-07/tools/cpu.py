import json,sys,statistics as st
for f in sys.argv[1:]:
  d=json.load(open(f))
  for m in d['modes']:
    cs=m['commands']
    cl=sum(c['client_cpu'] for c in cs); cmd=sum(c['T']['cpu'] for c in cs if 'T' in c)
    print(f.split('/')[-1], m['mode'], round(m['ok_per_min'],1), 'total', round(m['cpu_s'],2), 'daemon', round(m['daemon_cpu'],2), 'clients+cmds', round(cl,2), 'cmds', round(cmd,2), 'wall', round(m['wall_s'],2))
