#!/usr/bin/env bash
# .dev-san/run.sh — compute-sanitizer on the changed kernels, started in the background (the GPU suite runs beside
# it; neither is timed); .dev-prof/run.sh waits for /tmp/san.done and returns /tmp/san.
mkdir -p /tmp/san
(
    run() { # run TOOL TEST [FILTER]
        local f=/tmp/san/$1_$2${3:+_${3//[^a-z_]/}}.txt
        timeout 150 $CS --tool $1 ${3:+--kernel-name kns=$3} build/test_gpu $2 >$f 2>&1; echo "rc=$?" >>$f
        echo "$1 $2 ${3:-}: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $f | tail -1) $(tail -1 $f)"
    }
    run memcheck gpu_op_qwen3_5_elementwise
    run racecheck gpu_op_qwen3_5_elementwise conv_
    run racecheck gpu_op_qwen3_5_elementwise rmsnorm
    run memcheck gpu_op_rmsnorm
    run racecheck gpu_op_delta_rule_128 tc_prep
    run memcheck gpu_op_delta_rule_128
    run racecheck gpu_op_attention_forms sinks
    run memcheck gpu_op_attention_forms
    touch /tmp/san.done
) >/tmp/san/summary.txt 2>&1 &
echo "sanitizers started in the background"
