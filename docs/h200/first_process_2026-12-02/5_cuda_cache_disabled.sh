#!/usr/bin/env bash
# Run 5: the same benchmark on run 1's data with CUDA's JIT cache off (every kernel compiled from PTX is compiled again)
export PYTHONPATH=$PWD:${PYTHONPATH:-}
C="data=imagenet data.root=/tmp/bd loader.batch_size=256 trainer.amp=bf16 trainer.channels_last=true data.verify_files=false"
CUDA_CACHE_DISABLE=1 timeout 150 python scripts/benchmark.py --modes model e2e --models resnet18 --compile off --loaders dali \
  --steps 100 --warmup 30 --repeats 3 --out /tmp/br7 -- $C
