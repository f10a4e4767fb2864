#!/usr/bin/env bash
# shardlab simulate on the traffic the peers replayed: Llama-3.1-8B on one H100 (the
# plan solve proves for each engine), the Azure conversation hour at its own times and
# as a closed loop of 64 clients. Writes results/simulate/shardlab/.
set -e
cd "$(git rev-parse --show-toplevel)"

for e in vllm sglang trtllm; do
  python -m shardlab solve --model llama-3.1-8b --cluster h100x1 --engine $e --space engine --method cpsat --out results/simulate/shardlab/plan-llama-3.1-8b-h100x1-$e.json > /dev/null
  python -m shardlab simulate --plan results/simulate/shardlab/plan-llama-3.1-8b-h100x1-$e.json --traffic tests/data/traces/AzureLLMInferenceTrace_conv.csv.gz --format json > results/simulate/shardlab/$e-AzureLLMInferenceTrace_conv.json
  python -m shardlab simulate --plan results/simulate/shardlab/plan-llama-3.1-8b-h100x1-$e.json --traffic tests/data/traces/AzureLLMInferenceTrace_conv.csv.gz --clients 64 --format json > results/simulate/shardlab/$e-AzureLLMInferenceTrace_conv-closed64.json
done
echo ok
