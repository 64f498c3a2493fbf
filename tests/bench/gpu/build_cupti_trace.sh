#!/usr/bin/env bash
# Builds cupti_trace.c into /tmp/libcupti_trace.so against this GPU
# machine's CUPTI (the CUDA toolkit's, else the pip `nvidia` packages'),
# with the newest activity record types its headers define. Sourced: it
# exports CUPTI_LIB (the library's folder) and defines `trace NAME CMD...`,
# which runs CMD with the tracer writing $OUT/NAME.csv.
NVROOT=$(python3 -c "import nvidia; print(list(nvidia.__path__)[0])" 2>/dev/null || echo /nonexistent)
CUPTI=$(dirname "$(find -L /usr/local/cuda/ "$NVROOT" -name cupti.h 2>/dev/null | head -1)")
CUPTI_LIB=$(dirname "$(find -L /usr/local/cuda/ "$NVROOT" -name 'libcupti.so*' 2>/dev/null | head -1)")
echo "CUPTI headers $CUPTI, library $CUPTI_LIB"
newest() { grep -ho "CUpti_Activity$1[0-9]*;" "$CUPTI"/cupti_activity*.h | tr -d ';' | sort -V | tail -1; }
gcc -O2 -shared -fPIC -o /tmp/libcupti_trace.so tests/bench/gpu/cupti_trace.c -I"$CUPTI" -I/usr/local/cuda/include \
  -DKERNEL_T="$(newest Kernel)" -DMEMCPY_T="$(newest Memcpy)" -DMEMSET_T="$(newest Memset)" \
  -DSYNC_T="$(newest Synchronization)" -L"$CUPTI_LIB" -lcupti -Wl,-rpath,"$CUPTI_LIB"
export CUPTI_LIB
trace() { CUDA_INJECTION64_PATH=/tmp/libcupti_trace.so CUPTI_TRACE_OUT=$OUT/$1.csv "${@:2}"; }
