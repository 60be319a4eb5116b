torchrun --nproc_per_node 8 --nnodes 4 pretrain_gpt.py \
  --num-layers 8 --hidden-size 2048 --num-attention-heads 32 --group-query-attention --num-query-groups 4 \
  --kv-channels 128 --ffn-hidden-size 6144 --seq-length 4096 --micro-batch-size 1 --global-batch-size 256 \
  --bf16 --swiglu --normalization RMSNorm --position-embedding-type rope --untie-embeddings-and-output-weights --disable-bias-linear \
  --num-experts 128 --moe-router-topk 8 --moe-router-num-groups 8 --moe-router-group-topk 4 \
  --moe-ffn-hidden-size 768 --expert-model-parallel-size 32 --expert-tensor-parallel-size 1 \
  --moe-grouped-gemm --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep --moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity \
  --use-distributed-optimizer --vocab-size 151936
