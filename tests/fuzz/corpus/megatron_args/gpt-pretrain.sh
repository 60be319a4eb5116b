#!/bin/bash
# A Megatron-LM launch script written for offsim's import tests: a Llama-style 8B model on two
# 8-GPU nodes with TP 4, PP 2, sequence parallelism, the distributed optimizer, selective
# recompute and activation offload of the first 4 layers.
GPUS_PER_NODE=8

GPT_ARGS=(
    --tensor-model-parallel-size 4
    --pipeline-model-parallel-size 2
    --sequence-parallel
    --use-distributed-optimizer
    --overlap-grad-reduce
    --num-layers 32
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 8
    --vocab-size 128256
    --seq-length 4096
    --max-position-embeddings 4096
    --position-embedding-type rope
    --swiglu
    --normalization RMSNorm
    --untie-embeddings-and-output-weights
    --disable-bias-linear
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --micro-batch-size 1
    --global-batch-size 64
    --bf16
    --recompute-granularity selective
    --lr 3.0e-4
    --train-iters 1000
    --tokenizer-type HuggingFaceTokenizer
)

torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py \
    "${GPT_ARGS[@]}" \
    --data-path /data/corpus_text_document \
    --save /checkpoints/llama8b \
    --log-interval 10
