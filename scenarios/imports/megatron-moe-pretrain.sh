#!/bin/bash
# A Megatron-LM launch script written for offsim's import tests: a Qwen3-30B-A3B-shaped
# mixture-of-experts model (48 layers, 128 experts of FFN 768, top-8) on four 8-GPU nodes with
# expert parallelism 8, the distributed optimizer, dropless routing with forced load balancing,
# grouped GEMMs and the all-to-all token dispatcher.
MODEL_ARGS=(
    --num-layers 48
    --hidden-size 2048
    --ffn-hidden-size 6144
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 4
    --kv-channels 128
    --vocab-size 151936
    --seq-length 4096
    --max-position-embeddings 40960
    --position-embedding-type rope
    --swiglu
    --normalization RMSNorm
    --untie-embeddings-and-output-weights
    --disable-bias-linear
    --attention-dropout 0.0
    --hidden-dropout 0.0
)

MOE_ARGS=(
    --num-experts 128
    --moe-router-topk 8
    --moe-ffn-hidden-size 768
    --moe-router-load-balancing-type aux_loss
    --moe-aux-loss-coeff 1e-3
    --moe-router-force-load-balancing
    --moe-grouped-gemm
    --moe-permute-fusion
    --moe-token-dispatcher-type alltoall
    --expert-model-parallel-size 8
)

TRAIN_ARGS=(
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size 1
    --use-distributed-optimizer
    --overlap-grad-reduce
    --micro-batch-size 1
    --global-batch-size 256
    --bf16
    --lr 1.2e-4
    --train-iters 500
)

torchrun --nproc_per_node 8 --nnodes 4 pretrain_gpt.py \
    "${MODEL_ARGS[@]}" "${MOE_ARGS[@]}" "${TRAIN_ARGS[@]}" \
    --mock-data --log-interval 1
