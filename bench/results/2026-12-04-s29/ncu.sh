# Call 1's helper (.dev-ncu/run.sh): kernel durations of Qwen3 8L balanced under Nsight Compute (gpu__time_duration of
# each kernel from launch 1800 on, main's build), then a table by kernel. Nsight Compute runs the kernels one at a time
# at its base clocks: read the durations against each other, not against the step's times. (Call 1 ran it with the
# unit map lacking "ns", so its printed table is in ns under a "us" label; the CSV in call1.tgz has the units.)
NCU=/usr/local/cuda/bin/ncu
rm -rf /tmp/pith-bench-run /tmp/pith-bench-data; mkdir -p /tmp/pith-bench-data
build/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab 151936 --tokens 200000 --seed 1 >/dev/null
timeout 400 $NCU --metrics gpu__time_duration.sum --csv --launch-skip ${SKIP:-1800} --launch-count ${COUNT:-1400} \
    build/pith train bench/qwen3_30b_a3b_8l/train.json --set max_steps=4 --set benchmark=true >$OUT/ncu_qwen3.csv 2>$OUT/ncu_err.txt
echo "ncu rc=$?"
python3 - $OUT/ncu_qwen3.csv <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]; R = [dict(zip(h, r)) for r in rows[1:] if r[h.index('Metric Name')] == 'gpu__time_duration.sum']
print(len(R), 'kernels')
agg = collections.defaultdict(lambda: [0, 0.0])
for r in R:
    k = (r['Kernel Name'][:90], r['Grid Size'], r['Block Size'])
    v = float(r['Metric Value'].replace(',', '')) * {'ns': 1e-3, 'nsecond': 1e-3, 'us': 1.0, 'usecond': 1.0, 'ms': 1e3, 'msecond': 1e3}.get(r['Metric Unit'], 1.0)
    agg[k][0] += 1; agg[k][1] += v
for k, (n, t) in sorted(agg.items(), key=lambda x: -x[1][1])[:60]:
    print(f"{t:10.1f} us {n:5d}  {t/n:8.1f}  {k[1]:>16} {k[2]:>12}  {k[0]}")
PY
