# issue 22's loss comparison on the 8-layer Qwen3-30B-A3B benchmark model (5.6 B parameters, 2 x 4096 tokens a step,
# its own recipe: lr 3e-4 constant) on the King James Bible: 300 steps bf16, FP8 and bf16 again, force-balanced
MODEL=bench/qwen3_30b_a3b_8l PITH=build/pith SEEDS=1234 EXTRA="--set benchmark=true" \
  timeout 420 bash bench/run_fp8_loss.sh .gpu/kjv/tokens $OUT/big 300 > $OUT/big.txt 2>&1
echo "rc=$?"; grep -E "vs|gap" $OUT/big.txt; tail -2 $OUT/big/train_fp8-1234.txt
for r in bf16-1234 fp8-1234 bf16-1234-again; do gzip -9 $OUT/big/$r/metrics.jsonl; rm -f $OUT/big/$r/events.*; done
