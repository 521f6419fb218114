import json,sys,statistics as st
agg={}
for f in sys.argv[1:]:
  d=json.load(open(f))
  for m in d['modes']:
    ph={}
    for c in m['commands']:
        T=c.get('T'); tc=c.get('tc')
        if not T or not tc or tc['t_admitted'] is None: continue
        seq=[('boot',c['w0'],tc['t_proc']),('cli',tc['t_proc'],tc['t_attempt']),('queue',tc['t_attempt'],tc['t_admitted']),('spawn',tc['t_admitted'],T['first']),('ctx',T['first'],T['ctx']),('input',T['ctx'],T['input']),('sleep',T['input'],T['slept']),
             ('launch',T['slept'],T['launched']),('ws',T['launched'],T['ws']),('regwait',T['pre_region'],T['in_region']),
             ('region',T['in_region'],T['region_end']),('exit',T['region_end'],c['w1'])]
        for k,a,b in seq: ph.setdefault(k,[]).append(b-a)
    for k,v in ph.items(): agg.setdefault(m['mode'],{}).setdefault(k,[]).extend(v)
    agg[m['mode']].setdefault('okpm',[]).append(m['ok_per_min'])
for mode,ph in agg.items():
    print(mode, 'ok/min', round(st.mean(ph.pop('okpm')),1), ' '.join(f"{k}={st.mean(v):.3f}" for k,v in ph.items()))
