torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py \
  --num-layers 8 --hidden-size 2048 --num-attention-heads 32 --group-query-attention --num-query-groups 4 \
  --kv-channels 128 --ffn-hidden-size 6144 --seq-length 4096 --micro-batch-size 1 --global-batch-size 16 \
  --bf16 --swiglu --normalization RMSNorm --position-embedding-type rope --untie-embeddings-and-output-weights --disable-bias-linear \
  --num-experts 128 --moe-router-topk 8 --moe-ffn-hidden-size 768 --expert-model-parallel-size 4 \
  --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel \
  --moe-grouped-gemm --moe-token-dispatcher-type alltoall \
  --enable-cuda-graph --moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity \
  --use-distributed-optimizer --vocab-size 151936
