#!/usr/bin/env bash
# Multi-node training with torchrun's c10d rendezvous. Run the same command on every node,
# changing only NODE_RANK; the endpoint is a host:port reachable from all nodes (node 0's).
#   NNODES=2 NODE_RANK=0 MASTER=node0:29400 bash scripts/train_multinode.sh data=imagenet data.root=/data/imagenet
#   NNODES=2 NODE_RANK=1 MASTER=node0:29400 bash scripts/train_multinode.sh data=imagenet data.root=/data/imagenet
# Every node must see the dataset at the same path. The DALI shard of a process is its global rank,
# so the nodes read disjoint files; all ranks use rank 0's run-dir name (one folder on a shared FS).
set -euo pipefail
NNODES=${NNODES:?number of nodes}
NODE_RANK=${NODE_RANK:?the index of this node, 0..NNODES-1}
MASTER=${MASTER:?host:port of the rendezvous (node 0)}
# One process per GPU this node lets us use: CUDA_VISIBLE_DEVICES's list when set (nvidia-smi ignores it)
if [ -z "${NPROC:-}" ] && [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
  NPROC=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c . || true)
fi
NPROC=${NPROC:-$(nvidia-smi -L 2>/dev/null | grep -c GPU || true)}
[ "${NPROC:-0}" -gt 0 ] || NPROC=1
RDZV_ID=${RDZV_ID:-dali-train}
# From where it was launched (no cd): relative data paths and outputs/ stay where the user is, as with train.py
exec torchrun --nnodes="$NNODES" --node_rank="$NODE_RANK" --nproc_per_node="$NPROC" \
  --rdzv_backend c10d --rdzv_endpoint "$MASTER" --rdzv_id "$RDZV_ID" "$(dirname "$0")/../train.py" "$@"
