# setup.sh — sourced on the GPU machine by run.sh of validate-performance and of profile-gpu-step (from the
# repository root, with .dev-agents/ carried): unpacks pack.sh's binaries into $BIN/base and $BIN/feature and its
# libraries into $BIN/lib, and sets LD_LIBRARY_PATH so that they load there (the machine's own libmpi beside its
# mpirun; CUDA libraries from the PyTorch wheels when /usr/local/cuda lacks them).
BIN=${BIN:-/tmp/pith-agents-bin}
[ -f .dev-agents/BUILT ] || { echo "no .dev-agents/BUILT: run pack.sh on the development machine and carry .dev-agents"; exit 1; }
cat .dev-agents/BUILT
mkdir -p "$BIN/base" "$BIN/feature" "$BIN/lib"
for f in .dev-agents/base/*.gz .dev-agents/feature/*.gz; do
    side=$(basename "$(dirname "$f")")
    gunzip -c "$f" >"$BIN/$side/$(basename "$f" .gz)" && chmod +x "$BIN/$side/$(basename "$f" .gz)"
done
for f in .dev-agents/lib/*.gz; do gunzip -c "$f" >"$BIN/lib/$(basename "$f" .gz)"; done
export LD_LIBRARY_PATH=$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if ldd "$BIN/feature/pith" | grep -q "libmpi.so.* => not found" && command -v mpirun >/dev/null; then
    LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "$(readlink -f "$(command -v mpirun)")")/../lib
fi
if [ ! -e /usr/local/cuda/lib64/libcublasLt.so.13 ]; then
    for d in /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib; do LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d; done
fi
export LD_LIBRARY_PATH
if ldd "$BIN/feature/pith" | grep "not found"; then echo "setup.sh: libraries missing (above)"; exit 1; fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
