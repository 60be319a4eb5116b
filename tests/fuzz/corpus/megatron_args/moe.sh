torchrun --nproc_per_node 8 --nnodes 4 pretrain_gpt.py \
  --num-layers 48 --hidden-size 2048 --num-attention-heads 32 --group-query-attention --num-query-groups 4 \
  --kv-channels 128 --ffn-hidden-size 6144 --seq-length 4096 --max-position-embeddings 40960 \
  --micro-batch-size 1 --global-batch-size 256 --bf16 --swiglu --normalization RMSNorm \
  --position-embedding-type rope --untie-embeddings-and-output-weights --disable-bias-linear \
  --num-experts 128 --moe-router-topk 8 --moe-ffn-hidden-size 768 --expert-model-parallel-size 8 \
  --moe-grouped-gemm --moe-token-dispatcher-type alltoall --use-distributed-optimizer \
  --tensor-model-parallel-size 2 --sequence-parallel --moe-layer-freq "([0]*3+[1]*45)" --overlap-moe-expert-parallel-comm \
  --vocab-size 151936
