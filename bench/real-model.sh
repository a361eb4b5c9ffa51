#!/usr/bin/env bash
# Real-model bench: Sabi's agent against Qwen2.5-Coder-1.5B-Instruct on llama.cpp's own server
# and Whisper tiny.en, both on this CPU, through the model kit in ../shared/tools/local-llm
# (installed once into $SABI_LLM_DIR: about 1.2 GB cold). It runs the scenario set of
# benches/real_model.rs twice, with the model's stock chat template and with the kit's
# tool-parsing one, and prints each conversation and a summary line per template.
#
#   bench/real-model.sh                       # both templates
#   TEMPLATES=stock bench/real-model.sh       # one
#
# Not part of `cargo test` or CI. Voice notes are made with espeak-ng (installed with apt when
# missing and allowed; without it the two voice scenarios are skipped).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kit="${SABI_LLM_KIT:-$here/../shared/tools/local-llm}"
work="${SABI_LLM_DIR:-/tmp/sabi-llm}"
model_file="$work/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
llm_port="${LLM_PORT:-28930}" stt_port="${STT_PORT:-28931}"
read -r -a templates <<< "${TEMPLATES:-stock tool-parsing}"

[ -d "$kit" ] || { echo "no model kit at $kit (set SABI_LLM_KIT)" >&2; exit 2; }
[ -f "$model_file" ] || bash "$kit/setup.sh" "$work" 1.5b

voices="$work/voices"
mkdir -p "$voices"
if ! command -v espeak-ng >/dev/null; then
    apt-get install -y -qq espeak-ng >/dev/null 2>&1 || echo "no espeak-ng: the voice scenarios are skipped"
fi
if command -v espeak-ng >/dev/null; then
    espeak-ng -v en -s 150 -w "$voices/balance.wav" \
        "Hello. What is the balance on account zero one two three four five six seven eight nine?"
    espeak-ng -v en -s 150 -w "$voices/order.wav" \
        "Hello. Where is my card order four eight two one three?"
fi

cargo build --release --manifest-path "$here/Cargo.toml" --bench real_model >/dev/null 2>&1

pids=()
stop() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done; pids=(); }
trap stop EXIT

for template in "${templates[@]}"; do
    case "$template" in
        stock) template_file="" ;;
        tool-parsing) template_file="$kit/qwen25-fenced-tools.jinja" ;;
        *) echo "unknown template $template (stock, tool-parsing)" >&2; exit 2 ;;
    esac
    LLM_TEMPLATE_FILE="$template_file" "$work/venv/bin/python" "$kit/serve_llm.py" \
        "$model_file" "$llm_port" 2 4096 qwen2.5-coder-1.5b >"$work/llm-$template.log" 2>&1 &
    pids+=($!)
    "$work/venv/bin/python" "$kit/serve_stt.py" --port "$stt_port" --threads 2 \
        --upstream "http://127.0.0.1:$llm_port" >"$work/stt-$template.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 1 180); do
        curl -sf "http://127.0.0.1:$llm_port/health" >/dev/null && break
        sleep 1
    done
    REAL_MODEL_URL="http://127.0.0.1:$stt_port/v1" REAL_MODEL_NAME=qwen2.5-coder-1.5b \
    REAL_MODEL_TEMPLATE="$template template" REAL_MODEL_VOICES="$voices" \
        cargo bench --manifest-path "$here/Cargo.toml" --bench real_model 2>&1 | grep -v '^\s*\(Finished\|Running\|Compiling\)'
    stop
done
