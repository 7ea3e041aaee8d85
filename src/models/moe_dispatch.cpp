// Fused decode-MoE settings and the MoE dispatch trace (see moe_dispatch.h).
#include "models/moe_dispatch.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>

#include "core/error.h"

namespace moecel {
namespace {

std::mutex g_settings_mu;
bool g_settings_loaded = false;
FusedMoeSettings g_settings;

FusedMoeSettings settings_from_env() {
  FusedMoeSettings s;
  if (const char* v = std::getenv("MOECEL_FUSED_MOE"); v != nullptr && *v != '\0') {
    s.enabled = parse_on_off(v, "MOECEL_FUSED_MOE");
  }
  if (const char* v = std::getenv("MOECEL_FUSED_MOE_MAX_DFF"); v != nullptr && *v != '\0') {
    errno = 0;
    char* end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    MOECEL_CHECK(errno == 0 && end != v && *end == '\0' && n >= 0,
                 "MOECEL_FUSED_MOE_MAX_DFF='{}': expected a non-negative integer (the largest "
                 "moe_intermediate_size the fused decode-MoE path takes)",
                 v);
    s.max_dff = n;
  }
  return s;
}

std::atomic<int64_t> g_steps{0}, g_fused{0}, g_gather{0};
thread_local int t_step_depth = 0;
thread_local bool t_recording = false;
thread_local moe_trace::Counts t_recorded;  // what the Recording alive on this thread has counted

void print_totals() {
  const moe_trace::Counts c = moe_trace::totals();
  std::fflush(stdout);
  std::fprintf(stderr, "moe dispatch: decode_steps=%lld fused=%lld gather=%lld\n",
               static_cast<long long>(c.decode_steps), static_cast<long long>(c.fused),
               static_cast<long long>(c.gather));
  std::fflush(stderr);
}

}  // namespace

bool parse_on_off(const char* value, const char* what) {
  std::string v(value);
  for (char& c : v) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "off" || v == "no") return false;
  fail("{}='{}': expected on or off (1/true/on/yes or 0/false/off/no)", what, value);
}

FusedMoeSettings fused_moe_settings() {
  std::lock_guard<std::mutex> lock(g_settings_mu);
  if (!g_settings_loaded) {
    g_settings = settings_from_env();
    g_settings_loaded = true;
  }
  return g_settings;
}

void set_fused_moe_settings(const FusedMoeSettings& s) {
  std::lock_guard<std::mutex> lock(g_settings_mu);
  g_settings = s;
  g_settings_loaded = true;
}

namespace moe_trace {

Counts totals() {
  return Counts{g_steps.load(), g_fused.load(), g_gather.load()};
}

void reset() {
  g_steps = 0;
  g_fused = 0;
  g_gather = 0;
}

DecodeStep::DecodeStep() {
  ++t_step_depth;
  ++g_steps;
}

DecodeStep::~DecodeStep() {
  --t_step_depth;
}

Recording::Recording() {
  t_recorded = Counts{};
  t_recording = true;
}

Recording::~Recording() {
  t_recording = false;
}

Counts Recording::counts() const {
  return t_recorded;
}

void replayed_step(const Counts& per_step) {
  ++g_steps;
  g_fused += per_step.fused;
  g_gather += per_step.gather;
}

void dispatch(bool fused) {
  if (t_recording) {
    ++(fused ? t_recorded.fused : t_recorded.gather);
    return;
  }
  if (t_step_depth == 0) return;
  ++(fused ? g_fused : g_gather);
}

void install_from_env() {
  const char* v = std::getenv("MOECEL_TRACE");
  if (v == nullptr) return;
  std::string_view list(v);
  bool want = false;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    const std::string_view item = list.substr(0, comma);
    if (item == "moe" || item == "all") {
      want = true;
    } else if (!item.empty()) {
      // A misspelt category would otherwise print nothing, which reads like a run with no MoE layers.
      const std::string msg = printable_message(std::string(item));
      std::fprintf(stderr, "moecel: MOECEL_TRACE: unknown category '%s' ignored (known: moe, all)\n", msg.c_str());
    }
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
  }
  if (want) std::atexit(print_totals);
}

}  // namespace moe_trace
}  // namespace moecel
